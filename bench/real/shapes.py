"""Every API shape the filter reads, sent through Envoy with warmroute and straight to a
replica: each must be answered 200 both ways, the filter must have read its body (its debug
header names a pod and no `fallback=`), and the engine must count the same prompt tokens both
ways (the body reached it unchanged). With `fixtures`, the engine's own answers are written
there, as test inputs for the filter's and the simulator's parsers.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from engine import SERVED
from warmroute_harness import get, post
from workloads import TOOL_NAMES, stream

SYSTEM = ("You are a careful assistant. Answer in one short paragraph, and say so when a question "
          "cannot be answered from what was given. ") * 6
TOOLS = [{"type": "function", "function": {"name": n, "description": f"{n} on the workspace",
                                            "parameters": {"type": "object", "properties": {"path": {"type": "string"}},
                                                           "required": ["path"]}}} for n in TOOL_NAMES[:3]]
TOOL_TURN = [
    {"role": "system", "content": SYSTEM},
    {"role": "user", "content": "Read the configuration file and tell me which port the server uses."},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "read_file", "arguments": "{\"path\": \"server.toml\"}"}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "[server]\nhost = \"127.0.0.1\"\nport = 8080\n"},
]
CHAT = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "What does a prefix cache keep?"}]
PARTS = [{"role": "system", "content": SYSTEM},
         {"role": "user", "content": [{"type": "text", "text": "What does a prefix cache keep?"}]}]
PROMPT = SYSTEM + "\nQuestion: what does a prefix cache keep?\nAnswer:"

# name -> (path, body); every body asks for 8 tokens.
SHAPES: dict[str, tuple[str, dict]] = {
    "chat": ("/v1/chat/completions", {"messages": CHAT}),
    "chat, content parts": ("/v1/chat/completions", {"messages": PARTS}),
    "chat, stream": ("/v1/chat/completions", {"messages": CHAT, "stream": True}),
    "chat, stream + include_usage": ("/v1/chat/completions",
                                     {"messages": CHAT, "stream": True, "stream_options": {"include_usage": True}}),
    "chat, tools + tool_calls + tool message": ("/v1/chat/completions", {"messages": TOOL_TURN, "tools": TOOLS}),
    "chat, tools, stream + include_usage": ("/v1/chat/completions",
                                            {"messages": TOOL_TURN, "tools": TOOLS, "stream": True,
                                             "stream_options": {"include_usage": True}}),
    "completions": ("/v1/completions", {"prompt": PROMPT}),
    "completions, stream": ("/v1/completions", {"prompt": PROMPT, "stream": True}),
    "completions, stream + include_usage": ("/v1/completions",
                                            {"prompt": PROMPT, "stream": True,
                                             "stream_options": {"include_usage": True}}),
}


@dataclass
class Row:
    shape: str
    ok: bool
    detail: str


def _one(port: int, path: str, body: dict):
    """Status, prompt tokens (None if the answer carries no usage), headers, raw body."""
    if body.get("stream"):
        r = stream(port, path, body)
        return r.status, (r.prompt_tokens if r.usage else None), r.headers, r.chunks, r.error
    r = post(port, path, body)
    usage = r.json().get("usage") if r.status == 200 else None
    return r.status, (usage or {}).get("prompt_tokens"), r.headers, r.body, None


def check(envoy_port: int, replica_port: int, fixtures: Path | None = None,
          unasked_usage: frozenset[str] = frozenset()) -> list[Row]:
    """`unasked_usage`: the shapes whose answer the engine ends with usage though the request
    did not ask (llama.cpp's completions streams); their usage is checked like any other."""
    rows = []
    for name, (path, extra) in SHAPES.items():
        body = {"model": SERVED, "max_tokens": 8, **extra}
        st_e, pt_e, h_e, raw_e, err_e = _one(envoy_port, path, body)
        st_d, pt_d, _, raw_d, _ = _one(replica_port, path, body)
        route = dict(kv.split("=", 1) for kv in h_e.get("x-warmroute", "").split(";") if "=" in kv)
        wants_usage = (not body.get("stream") or body.get("stream_options", {}).get("include_usage")
                       or name in unasked_usage)
        problems = []
        if st_e != 200 or st_d != 200:
            problems.append(f"status {st_e} via Envoy, {st_d} direct {err_e or ''}")
        if "backend" not in route or "fallback" in route:
            problems.append(f"filter did not read the body: x-warmroute={h_e.get('x-warmroute')!r}")
        if wants_usage and (pt_e is None or pt_e != pt_d):
            problems.append(f"prompt tokens {pt_e} via Envoy vs {pt_d} direct")
        if not wants_usage and pt_e is not None:
            problems.append("a usage chunk nobody asked for")
        detail = (f"pod {route.get('backend')}, {route.get('reason')}, prompt tokens {pt_e} = direct"
                  if wants_usage else f"pod {route.get('backend')}, {route.get('reason')}, {raw_e} chunks, no usage")
        rows.append(Row(name, not problems, "; ".join(problems) or detail))
        if fixtures is not None and isinstance(raw_d, bytes):
            slug = name.replace(", ", "-").replace(" + ", "-").replace(" ", "_")
            (fixtures / f"vllm-{slug}.json").write_bytes(raw_d)
    m_e, m_d = json.loads(get(envoy_port, "/v1/models")), json.loads(get(replica_port, "/v1/models"))
    same = [d["id"] for d in m_e["data"]] == [d["id"] for d in m_d["data"]] == [SERVED]
    rows.append(Row("GET /v1/models", same, f"ids {[d['id'] for d in m_e['data']]}, max_model_len "
                                           f"{m_e['data'][0].get('max_model_len')}"))
    if fixtures is not None:
        (fixtures / "vllm-models.json").write_text(json.dumps(m_d, indent=1) + "\n")
        raw = stream_raw(replica_port, "/v1/chat/completions",
                         {"model": SERVED, "max_tokens": 4, "messages": CHAT, "stream": True,
                          "stream_options": {"include_usage": True}})
        (fixtures / "vllm-chat-stream-include_usage.sse").write_bytes(raw)
    return rows


def stream_raw(port: int, path: str, body: dict) -> bytes:
    """A stream's bytes as the engine wrote them (the SSE framing included)."""
    return post(port, path, body).body
