"""Shared pieces of the generation-serving tests: a tiny random llama GGUF with a real
byte-level BPE tokenizer (tests/models/llm/tiny_llama.py) and chat templates in the
styles of Llama 3, ChatML (Qwen) and Gemma 3."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

from tests.serve.live import LiveServer

# Llama-3-style: bos_token, a system header, strftime_now / date_string, raise_exception.
LLAMA3 = """{{- bos_token }}
{%- if not date_string is defined %}
    {%- set date_string = strftime_now("%d %b %Y") %}
{%- endif %}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}
{{- "Today Date: " + date_string + "\\n\\n" }}
{{- system_message }}
{{- "<|eot_id|>" }}
{%- for message in messages %}
    {%- if message['role'] not in ['user', 'assistant'] %}
        {{- raise_exception("Unknown role: " + message['role']) }}
    {%- endif %}
    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
"""

# ChatML (Qwen 2.5 style) written without whitespace control: trim_blocks and
# lstrip_blocks decide every newline.
CHATML = """{% for message in messages %}
    {% if loop.first and messages[0]['role'] != 'system' %}
{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}
    {% endif %}
{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}
{% endfor %}
{% if add_generation_prompt %}
{{ '<|im_start|>assistant\\n' }}
{% endif %}
"""

# Gemma 3's template (google/gemma-3-270m-it); the GGUF file of the test package has none.
GEMMA3 = """{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\\n\\n' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'image' -%}
                {{ '<start_of_image>' }}
            {%- elif item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>\\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\\n'}}
{%- endif -%}
"""

# tojson (no HTML escaping, non-ASCII kept), namespace, loop controls.
TOOLS = """{%- set ns = namespace(n=0) %}
{%- for m in messages %}
    {%- if m['role'] == 'stop' %}{% break %}{% endif %}
    {%- set ns.n = ns.n + 1 %}
{{ m | tojson }}
{%- endfor %}
{{ ns.n }}{{ eos_token }}"""


@lru_cache(maxsize=1)
def bpe_meta() -> dict[str, Any]:
    """The tiny byte-level BPE's tokenizer.ggml.* keys (trained once per process)."""
    from tests.models.llm.tiny_llama import bpe_meta as meta

    return meta()


def tiny_gguf(path: Path, template: str | None = LLAMA3, seed: int = 3) -> Path:
    """A tiny random llama GGUF at ``path`` with the BPE tokenizer, a BOS added to text
    prompts, a 512-token context and ``template`` as tokenizer.chat_template (None: no
    template)."""
    from tests.models.llm.tiny_llama import hf_weights, write_gguf

    meta = dict(bpe_meta())
    meta["tokenizer.ggml.add_bos_token"] = True
    meta["{arch}.context_length"] = 512
    meta["tokenizer.ggml.eot_token_id"] = meta["tokenizer.ggml.tokens"].index("<|eot_id|>")
    if template is not None:
        meta["tokenizer.chat_template"] = template
    write_gguf(path, hf_weights(seed=seed, vocab=len(meta["tokenizer.ggml.tokens"])), meta=meta)
    return path


class Server(LiveServer):
    """tests/serve/live.py's server of ``app``, which it keeps as ``app``."""

    def __init__(self, app: Any) -> None:
        super().__init__(app)
        self.app = app


def wait_for(predicate: Any, what: str, guard_s: float = 60.0) -> None:
    """Poll ``predicate()`` until true; AssertionError naming ``what`` after ``guard_s``
    (a hang guard: nothing is measured)."""
    import time

    deadline = time.monotonic() + guard_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.005)


class Broken:
    """A decoder whose decode steps give NaN logits for ``slot`` (a broken weight)."""

    def __init__(self, inner: Any, slot: int) -> None:
        self.inner, self.slot = inner, slot

    def step(self, slots: Any, tokens: Any) -> Any:
        out = self.inner.step(slots, tokens)
        out[[i for i, s in enumerate(slots) if s == self.slot]] = float("nan")
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)
