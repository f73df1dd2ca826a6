"""The two workloads of `make real` and the client that plays them: multi-turn chats and
tool-using agents, each request a stream with `include_usage`, so every answer carries the
engine's own `cached_tokens` and the client sees its first token.

Prompts are paragraphs of the corpus the tokenizer was trained on (English), so the
engine's token counts are those of a real BPE tokenizer. Every session's turns go in order,
a turn only after the previous one's answer; `concurrency` workers take the ready sessions
in turn, so all sessions stay live through the run and their contexts compete for the
replicas' KV.

- chat: one system prompt shared by every session (an assistant product's), then user turns
  and the engine's own answers (its real reply text goes back in the next turn, as a chat
  client sends it).
- agent: a system prompt and tool schemas shared by every agent, a task of its own, then
  steps: the model's turn comes back as an assistant `tool_calls` message and the tool's
  output as a `tool` message (a dummy-weight model writes no real tool call, so the agent
  writes the call it would have parsed), each step's context the previous one's plus both.
"""

from __future__ import annotations

import http.client
import json
import queue
import random
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from engine import MODEL_DIR, SERVED

# The text prompts are drawn from: vLLM's model directory's; `run_llama.py` points it at the
# same corpus beside llama.cpp's GGUF.
CORPUS = MODEL_DIR / "corpus.txt"


class Corpus:
    """The tokenizer's training text, cut into prompts of about `n` tokens."""

    # Bytes per token of the trained tokenizer on its corpus (model.py prints it): only to size
    # prompts, the engine's own counts are what is measured.
    BYTES_PER_TOKEN = 3.9

    def __init__(self, path: Path | None = None) -> None:
        self.paragraphs = [p for p in (path or CORPUS).read_text().splitlines() if p]

    def text(self, rng: random.Random, tokens: int) -> str:
        want = int(tokens * self.BYTES_PER_TOKEN)
        i = rng.randrange(len(self.paragraphs))
        out: list[str] = []
        size = 0
        while size < want:
            p = self.paragraphs[i % len(self.paragraphs)]
            out.append(p)
            size += len(p) + 1
            i += 1
        return " ".join(out)[:want]


TOOL_NAMES = ["read_file", "run_tests", "grep", "list_dir", "apply_patch", "run_shell"]


def tools(corpus: Corpus, rng: random.Random) -> list[dict]:
    return [{"type": "function", "function": {
        "name": name, "description": corpus.text(rng, 50),
        "parameters": {"type": "object", "properties": {"path": {"type": "string", "description": corpus.text(rng, 12)},
                                                        "query": {"type": "string"}},
                       "required": ["path"]}}} for name in TOOL_NAMES]


@dataclass
class Session:
    sid: str
    kind: str
    messages: list[dict]
    turns: int
    extra: dict = field(default_factory=dict)  # tools
    done: int = 0


@dataclass
class Workload:
    name: str
    sessions: list[Session]
    next_turn: object  # (session, reply text, rng) -> None: appends the next turn's messages
    max_tokens: int
    concurrency: int
    why: str


def chat_workload(seed: int = 1, sessions: int = 12, turns: int = 6, system_tokens: int = 400,
                  user_tokens: int = 150, reply_tokens: int = 32) -> Workload:
    corpus, rng = Corpus(), random.Random(seed)
    system = corpus.text(rng, system_tokens)
    ss = [Session(f"chat{i}", "chat", [{"role": "system", "content": system},
                                       {"role": "user", "content": corpus.text(rng, user_tokens)}], turns)
          for i in range(sessions)]

    def next_turn(s: Session, reply: str, rng: random.Random) -> None:
        s.messages += [{"role": "assistant", "content": reply},
                       {"role": "user", "content": corpus.text(rng, user_tokens)}]

    return Workload("chat", ss, next_turn, reply_tokens, 3,
                    f"{sessions} chats x {turns} turns, 3 at a time: a {system_tokens}-token system prompt shared "
                    f"by all, {user_tokens}-token user turns, {reply_tokens}-token answers sent back; final contexts "
                    f"~{system_tokens + turns * (user_tokens + reply_tokens + 10)} tokens")


def agent_workload(seed: int = 2, agents: int = 8, steps: int = 6, system_tokens: int = 300,
                   task_tokens: int = 120, tool_tokens: int = 250, reply_tokens: int = 24) -> Workload:
    corpus, rng = Corpus(), random.Random(seed)
    system = corpus.text(rng, system_tokens)
    schema = tools(corpus, rng)
    ss = [Session(f"agent{i}", "agent", [{"role": "system", "content": system},
                                         {"role": "user", "content": corpus.text(rng, task_tokens)}], steps,
                  {"tools": schema})
          for i in range(agents)]

    def next_turn(s: Session, reply: str, rng: random.Random) -> None:
        call = {"id": f"call_{s.sid}_{s.done}", "type": "function",
                "function": {"name": rng.choice(TOOL_NAMES),
                             "arguments": json.dumps({"path": f"src/{rng.choice(corpus.paragraphs[:50])[:24]}.py"})}}
        s.messages += [{"role": "assistant", "content": None, "tool_calls": [call]},
                       {"role": "tool", "tool_call_id": call["id"], "content": corpus.text(rng, tool_tokens)}]

    schema_tokens = len(json.dumps(schema)) / Corpus.BYTES_PER_TOKEN
    return Workload("agent", ss, next_turn, reply_tokens, 3,
                    f"{agents} agents x {steps} steps, 3 at a time: a {system_tokens}-token system prompt and "
                    f"~{schema_tokens:.0f} tokens of tool schemas shared by all, a {task_tokens}-token task, "
                    f"each step a tool call and a {tool_tokens}-token tool output; final contexts "
                    f"~{system_tokens + schema_tokens + task_tokens + steps * (tool_tokens + 40):.0f} tokens")


@dataclass
class Result:
    """One request as the client saw it."""

    status: int
    ttft_s: float | None
    total_s: float
    usage: dict | None
    text: str
    headers: dict[str, str]
    chunks: int = 0
    error: str | None = None

    @property
    def route(self) -> dict[str, str]:
        """The filter's debug header (`backend=..;match=M/T;reason=..`), parsed."""
        return dict(kv.split("=", 1) for kv in self.headers.get("x-warmroute", "").split(";") if "=" in kv)

    @property
    def prompt_tokens(self) -> int:
        return (self.usage or {}).get("prompt_tokens", 0)

    @property
    def cached_tokens(self) -> int:
        return ((self.usage or {}).get("prompt_tokens_details") or {}).get("cached_tokens", 0)


def stream(port: int, path: str, body: dict, timeout: float = 120) -> Result:
    """One streamed request over its own connection: time to the first token, the text, the
    usage chunk (if any), the response headers."""
    data = json.dumps(body).encode()
    t0 = time.time()
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.connect()
        c.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        c.request("POST", path, body=data, headers={"content-type": "application/json"})
        r = c.getresponse()
        headers = {k.lower(): v for k, v in r.getheaders()}
        if r.status != 200:
            return Result(r.status, None, time.time() - t0, None, "", headers, error=r.read()[:300].decode(errors="replace"))
        ttft, usage, text, n = None, None, [], 0
        while True:
            line = r.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            n += 1
            if chunk.get("usage"):
                usage = chunk["usage"]
            for ch in chunk.get("choices") or []:
                piece = (ch.get("delta") or {}).get("content") or ch.get("text") or ""
                if ttft is None and (piece or ch.get("finish_reason") or (ch.get("delta") or {}).get("tool_calls")):
                    ttft = time.time() - t0
                text.append(piece)
        return Result(200, ttft, time.time() - t0, usage, "".join(text), headers, n)
    except OSError as e:
        return Result(0, None, time.time() - t0, None, "", {}, error=repr(e))
    finally:
        c.close()


@dataclass
class Record:
    workload: str
    session: str
    turn: int
    result: Result
    canonical_bytes: int


def canonical_bytes(body: dict) -> int:
    """The length of the filter's canonical prompt stream for a chat body: `tools` as raw JSON
    (compact), then per message 0x1e role 0x1f content [0x1d tool_calls JSON]
    (filter/core/src/prompt/openai). Used only to compare bytes per token."""
    n = len(json.dumps(body["tools"], separators=(",", ":"))) if body.get("tools") else 0
    for m in body["messages"]:
        n += 2 + len(m["role"]) + len((m.get("content") or "").encode())
        if m.get("tool_calls"):
            n += 1 + len(json.dumps(m["tool_calls"], separators=(",", ":")))
    return n


def play(w: Workload, port: int, seed: int = 7, timeout_s: float = 240) -> list[Record]:
    """Plays `w` through 127.0.0.1:`port` with `w.concurrency` workers; returns every request."""
    ready: queue.Queue[Session] = queue.Queue()
    for s in w.sessions:
        ready.put(s)
    out: list[Record] = []
    lock = threading.Lock()
    remaining = [len(w.sessions)]
    rng = random.Random(seed)
    deadline = time.time() + timeout_s

    def worker() -> None:
        while time.time() < deadline:
            with lock:
                if remaining[0] == 0:
                    return
            try:
                s = ready.get(timeout=0.2)
            except queue.Empty:
                continue
            body = {"model": SERVED, "messages": s.messages, "max_tokens": w.max_tokens, "ignore_eos": True,
                    "stream": True, "stream_options": {"include_usage": True}, **s.extra}
            r = stream(port, "/v1/chat/completions", body)
            with lock:
                out.append(Record(w.name, s.sid, s.done, r, canonical_bytes(body)))
                s.done += 1
                if s.done >= s.turns or r.status != 200:
                    remaining[0] -= 1
                    continue
                w.next_turn(s, r.text, rng)
            ready.put(s)

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(w.concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout_s + 30)
    return out
