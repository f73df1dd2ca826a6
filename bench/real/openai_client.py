"""The same API shapes through an independent client: the `openai` Python package (installed
with vLLM in `.venv-real`), against Envoy with warmroute. Run by run.py as

    .venv-real/bin/python openai_client.py BASE_URL MODEL

and prints one JSON line per shape: its name, whether it passed, and what was seen.
"""

from __future__ import annotations

import json
import sys

from openai import OpenAI

SYSTEM = "You are a careful assistant. Answer in one short paragraph. " * 8
TOOLS = [{"type": "function", "function": {"name": "read_file", "description": "read a file",
                                            "parameters": {"type": "object", "properties": {"path": {"type": "string"}},
                                                           "required": ["path"]}}}]


def main(base: str, model: str) -> int:
    client = OpenAI(base_url=base, api_key="unused", max_retries=0, timeout=120)
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "What is a prefix cache?"}]
    results = []

    def shape(name, fn):
        try:
            ok, seen = fn()
        except Exception as e:  # noqa: BLE001 (a client error is this shape's result)
            ok, seen = False, f"{type(e).__name__}: {e}"[:300]
        results.append({"shape": name, "ok": ok, "seen": seen})

    def chat():
        r = client.chat.completions.create(model=model, messages=msgs, max_tokens=8)
        d = r.usage.prompt_tokens_details
        return r.choices[0].message is not None and d is not None, \
            f"prompt {r.usage.prompt_tokens}, cached {d.cached_tokens if d else None}"

    def chat_again():  # the same prompt again: the pod that answered must have it cached
        r = client.chat.completions.create(model=model, messages=msgs, max_tokens=8)
        d = r.usage.prompt_tokens_details
        return bool(d and d.cached_tokens > 0), f"prompt {r.usage.prompt_tokens}, cached {d.cached_tokens}"

    def chat_stream(usage: bool):
        def run():
            extra = {"stream_options": {"include_usage": True}} if usage else {}
            chunks = list(client.chat.completions.create(model=model, messages=msgs, max_tokens=8, stream=True,
                                                         **extra))
            got = [c.usage for c in chunks if c.usage]
            return (bool(got) == usage and len(chunks) > 1,
                    f"{len(chunks)} chunks, usage {got[-1].prompt_tokens if got else None}")
        return run

    def tools():
        turn = msgs + [
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "read_file", "arguments": "{\"path\": \"a.py\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "print('hello')"}]
        r = client.chat.completions.create(model=model, messages=turn, tools=TOOLS, max_tokens=8)
        return r.usage.prompt_tokens > 0, f"prompt {r.usage.prompt_tokens}, finish {r.choices[0].finish_reason}"

    def completions():
        r = client.completions.create(model=model, prompt=SYSTEM + "\nQ: what is a prefix cache?\nA:", max_tokens=8)
        return r.usage.prompt_tokens > 0, f"prompt {r.usage.prompt_tokens}"

    def completions_stream():
        chunks = list(client.completions.create(model=model, prompt=SYSTEM + "\nQ: why?\nA:", max_tokens=8,
                                                stream=True, stream_options={"include_usage": True}))
        got = [c.usage for c in chunks if c.usage]
        return bool(got), f"{len(chunks)} chunks, usage {got[-1].prompt_tokens if got else None}"

    def models():
        ids = [m.id for m in client.models.list()]
        return ids == [model], f"ids {ids}"

    shape("chat", chat)
    shape("chat, same prompt again", chat_again)
    shape("chat, stream", chat_stream(False))
    shape("chat, stream + include_usage", chat_stream(True))
    shape("chat, tools + tool_calls + tool message", tools)
    shape("completions", completions)
    shape("completions, stream + include_usage", completions_stream)
    shape("models.list", models)
    for r in results:
        print(json.dumps(r))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
