"""The OpenAI-compatible HTTP server (`rlx serve`)."""
