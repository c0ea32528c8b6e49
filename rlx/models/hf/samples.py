"""Built-in calibration text: a few dozen everyday English sentences of mixed length and
topic, used to calibrate INT8 activation ranges when the user gives no text of their own."""

from __future__ import annotations

__all__ = ["CALIBRATION_TEXTS"]

CALIBRATION_TEXTS: tuple[str, ...] = (
    "The cat sat on the mat.",
    "A man is playing a guitar on the street corner while people walk past.",
    "How do I reset my password if I no longer have access to my email?",
    "Stock markets fell sharply on Monday after the central bank raised interest rates.",
    "She baked a chocolate cake for her grandmother's ninetieth birthday.",
    "The quick brown fox jumps over the lazy dog.",
    "Photosynthesis converts light energy into chemical energy stored in glucose.",
    "Our flight was delayed by three hours because of a storm over the Atlantic.",
    "Python is a popular programming language for data science and machine learning.",
    "The museum is closed on Mondays and public holidays.",
    "Please restart the router and wait two minutes before trying again.",
    "He scored the winning goal in the final minute of extra time.",
    "Drink plenty of water and get some rest if you have a fever.",
    "The committee will publish its recommendations at the end of the year.",
    "A young girl is riding a red bicycle through the park on a sunny afternoon.",
    "What is the capital of Australia?",
    "The recipe calls for two cups of flour, one egg and a pinch of salt.",
    "Electric cars are becoming cheaper as battery prices continue to drop.",
    "I lost my keys somewhere between the office and the train station.",
    "The novel tells the story of a family living through the great depression.",
    "Scientists discovered a new species of frog in the rainforest of Ecuador.",
    "Can you recommend a good Italian restaurant near the city centre?",
    "The software update fixes several security vulnerabilities and improves battery life.",
    "Two dogs are chasing a ball across a wide green field.",
    "The river flooded the village after a week of heavy rain, and hundreds of families "
    "had to leave their homes while rescue teams worked through the night.",
    "Mathematics is the language in which the laws of nature are written.",
    "The concert was cancelled at the last minute.",
    "Remember to water the plants while I am away on holiday.",
    "A woman is slicing tomatoes in a small kitchen.",
    "The train to Berlin leaves from platform nine at half past seven.",
    "Vaccines train the immune system to recognise and fight specific pathogens.",
    "Thanks!",
)
