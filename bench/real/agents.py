"""The APIs agents speak, against the real engine (section 5 of `make real`).

- `/v1/responses` with `previous_response_id`: the replicas run with
  `VLLM_ENABLE_RESPONSES_API_STORE=1`, so each keeps the responses it answered in its own
  memory. A 10-turn conversation, each turn naming the previous answer, on a fresh
  connection through an Envoy of 2 workers (so turns cross worker VMs), streamed and not in
  turn: every turn must be answered 200, every follow-up must reach the pod that answered its
  predecessor (the filter's debug header and the engine's own log of who served), and hit the
  cache there, by the engine's `cached_tokens` and its prefix-cache counters. The control: the
  same first follow-up through Envoy's round robin, which reaches another pod (404).
- `/v1/messages`: an agent's 6 steps (text-block system prompt, tools, each step a `tool_use`
  answered by a `tool_result`): each turn's predicted match (the debug header's `match=M/T`)
  must grow, and the engine's `cache_read_input_tokens` with it.
"""

from __future__ import annotations

import json
from pathlib import Path

from engine import SERVED, Replica
from warmroute_harness import Envoy, post

DEBUG = {"debug_header": True, "debug_match_counts": True}
INSTRUCTIONS = ("You are the build assistant of a small team. Answer in one short paragraph, name the file "
                "you mean, and say so when a question cannot be answered from what was given. ") * 4
QUESTIONS = ["Which file starts the server?", "Where is the port set?", "What reads the configuration?",
             "Which test covers the parser?", "Where are requests logged?", "What retries a failed call?",
             "Which module owns the cache?", "Where is the timeout?", "What builds the release?",
             "Who calls the scheduler?"]
TOOLS = [{"name": n, "description": f"{n.replace('_', ' ')} in the workspace",
          "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}
         for n in ("read_file", "list_dir", "grep")]


def note(reply) -> dict[str, str]:
    return dict(kv.split("=", 1) for kv in reply.headers.get("x-warmroute", "").split(";") if "=" in kv)


def events(body: bytes) -> list[tuple[str, dict]]:
    out = []
    for block in body.decode(errors="replace").split("\n\n"):
        fields = {}
        for line in block.splitlines():
            k, _, v = line.partition(":")
            fields[k] = v.strip()
        if fields.get("data", "").startswith("{"):
            out.append((fields.get("event", ""), json.loads(fields["data"])))
    return out


def respond(port: int, body: dict):
    """(reply, the response object as it ended or None)."""
    r = post(port, "/v1/responses", body, timeout=300)
    if r.status != 200:
        return r, None
    if body.get("stream"):
        done = [d["response"] for name, d in events(r.body) if name == "response.completed"]
        return r, (done[-1] if done else None)
    return r, r.json()


def hits(replicas: list[Replica]) -> dict[str, float]:
    return {r.name: r.metrics().get("vllm:prefix_cache_hits_total", 0.0) for r in replicas}


def responses_conversation(replicas: list[Replica], logdir: Path, fixtures: Path | None) -> dict:
    envoy = Envoy(replicas, filter_overrides=DEBUG, concurrency=2)
    envoy.start(logdir)
    rows, previous, holder, ok = [], None, None, True
    try:
        for r in replicas:
            envoy.wait_scraped(r)
        before = hits(replicas)
        for turn, q in enumerate(QUESTIONS):
            body = {"model": SERVED, "instructions": INSTRUCTIONS, "input": q, "max_output_tokens": 8,
                    "stream": turn % 2 == 1}
            if previous:
                body["previous_response_id"] = previous
            reply, done = respond(envoy.port, body)
            route = note(reply)
            usage = (done or {}).get("usage") or {}
            row = {"turn": turn + 1, "status": reply.status, "stream": body["stream"], "pod": route.get("backend"),
                   "reason": route.get("reason"), "previous": route.get("previous_response"),
                   "input_tokens": usage.get("input_tokens"),
                   "cached_tokens": (usage.get("input_tokens_details") or {}).get("cached_tokens"),
                   "id": (done or {}).get("id")}
            rows.append(row)
            if reply.status != 200 or done is None:
                ok = False
                row["error"] = reply.body[:200].decode(errors="replace")
                break
            if turn == 0:
                holder = row["pod"]
            else:
                ok &= row["pod"] == holder and row["reason"] == "stored_response" and (row["cached_tokens"] or 0) > 0
            previous = done["id"]
            if fixtures is not None and turn < 2:
                name = "vllm-responses-stream.sse" if body["stream"] else "vllm-responses.json"
                (fixtures / name).write_bytes(reply.body)
        after = hits(replicas)
        stats = envoy.settled_stats()
    finally:
        envoy.stop()
    counters = {k.split("warmroute.", 1)[1]: int(v) for k, v in stats.items()
                if k.startswith("wasmcustom.warmroute.responses.") or k == "wasmcustom.warmroute.decision.stored_response"}
    return {"rows": rows, "ok": ok, "holder": holder, "stats": counters,
            "engine_hits": {n: after[n] - before[n] for n in after}}


def round_robin_control(replicas: list[Replica], logdir: Path) -> dict:
    envoy = Envoy(replicas, with_filter=False, lb="round_robin", concurrency=1)
    envoy.start(logdir)
    try:
        first, done = respond(envoy.port, {"model": SERVED, "instructions": INSTRUCTIONS, "input": QUESTIONS[0],
                                           "max_output_tokens": 8})
        second, _ = respond(envoy.port, {"model": SERVED, "instructions": INSTRUCTIONS, "input": QUESTIONS[1],
                                         "max_output_tokens": 8, "previous_response_id": (done or {}).get("id")})
    finally:
        envoy.stop()
    return {"first": first.status, "follow_up": second.status,
            "follow_up_said": second.body[:120].decode(errors="replace")}


def messages_agent(replicas: list[Replica], logdir: Path, fixtures: Path | None) -> dict:
    envoy = Envoy(replicas, filter_overrides=DEBUG, concurrency=2)
    envoy.start(logdir)
    rows, ok = [], True
    system = [{"type": "text", "text": INSTRUCTIONS}]
    messages = [{"role": "user", "content": "The parser test fails on empty input. Find out why and say which file to change."}]
    try:
        for r in replicas:
            envoy.wait_scraped(r)
        for step in range(6):
            body = {"model": SERVED, "max_tokens": 8, "system": system, "tools": TOOLS, "messages": messages,
                    "stream": step % 2 == 1}
            reply = post(envoy.port, "/v1/messages", body, timeout=300)
            route = note(reply)
            m, _, t = route.get("match", "0/0").partition("/")
            row = {"turn": step + 1, "status": reply.status, "stream": body["stream"], "pod": route.get("backend"),
                   "reason": route.get("reason"), "match": int(m), "blocks": int(t or 0),
                   "fallback": route.get("fallback")}
            rows.append(row)
            if reply.status != 200:
                ok = False
                row["error"] = reply.body[:200].decode(errors="replace")
                break
            if body["stream"]:
                evs = events(reply.body)
                text = "".join(d.get("delta", {}).get("text", "") for n, d in evs if n == "content_block_delta")
                usage = next((d.get("usage") for n, d in evs if n == "message_delta"), {}) or {}
            else:
                answer = reply.json()
                text = "".join(c.get("text", "") for c in answer.get("content", []) if c.get("type") == "text")
                usage = answer.get("usage") or {}
            row.update({k: usage.get(k) for k in ("input_tokens", "cache_read_input_tokens",
                                                  "cache_creation_input_tokens")})
            if fixtures is not None and step < 2:
                name = "vllm-messages-stream.sse" if body["stream"] else "vllm-messages.json"
                (fixtures / name).write_bytes(reply.body)
            messages.append({"role": "assistant", "content": [
                {"type": "text", "text": text or "Reading."},
                {"type": "tool_use", "id": f"toolu_{step:02d}", "name": "read_file",
                 "input": {"path": f"src/parser_{step}.rs"}}]})
            messages.append({"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": f"toolu_{step:02d}",
                 "content": f"fn parse_{step}(input: &str) -> Result<Ast, Error> {{ if input.is_empty() {{ "
                            f"return Err(Error::Empty); }} tokens(input).map(Ast::from) }}\n" * 3}]})
        stats = envoy.settled_stats()
    finally:
        envoy.stop()
    grows = all(b["match"] > a["match"] for a, b in zip(rows, rows[1:]))
    reads = [r.get("cache_read_input_tokens") or 0 for r in rows[1:]]
    ok &= grows and all(r > 0 for r in reads) and not any(r["fallback"] for r in rows)
    reports = int(stats.get("wasmcustom.warmroute.feedback.reports", "0"))
    return {"rows": rows, "ok": ok, "match_grows": grows, "feedback_reports": reports}


def section(replicas: list[Replica], logdir: Path, out: dict, fixtures: Path | None) -> bool:
    print("\n## 5. The APIs agents speak: /v1/responses by previous_response_id, /v1/messages\n", flush=True)
    res = responses_conversation(replicas, logdir, fixtures)
    print(f"A 10-turn /v1/responses conversation (VLLM_ENABLE_RESPONSES_API_STORE=1), each turn on a fresh "
          f"connection through an Envoy of 2 workers, streamed on even turns:\n")
    print("| turn | status | stream | pod | reason | input tokens | cached tokens (engine) |")
    print("|---|---|---|---|---|---|---|")
    for r in res["rows"]:
        print(f"| {r['turn']} | {r['status']} | {'yes' if r['stream'] else 'no'} | {r['pod']} | {r['reason']} | "
              f"{r['input_tokens']} | {r['cached_tokens']} |" + (f" {r['error']}" if "error" in r else ""))
    print(f"\nfilter: {res['stats']}; engines' prefix-cache hits (tokens) during it: "
          + ", ".join(f"{n} {v:.0f}" for n, v in res["engine_hits"].items()))
    ctl = round_robin_control(replicas, logdir)
    print(f"\ncontrol, Envoy's round robin without the filter: first turn {ctl['first']}, its follow-up "
          f"{ctl['follow_up']} ({ctl['follow_up_said']})")
    msg = messages_agent(replicas, logdir, fixtures)
    print("\nAn agent's 6 steps on /v1/messages (system in text blocks, 3 tools, tool_use answered by tool_result):\n")
    print("| turn | status | stream | pod | reason | predicted match (blocks) | engine: input / cache read / cache written |")
    print("|---|---|---|---|---|---|---|")
    for r in msg["rows"]:
        print(f"| {r['turn']} | {r['status']} | {'yes' if r['stream'] else 'no'} | {r['pod']} | {r['reason']} | "
              f"{r['match']}/{r['blocks']} | {r.get('input_tokens')} / {r.get('cache_read_input_tokens')} / "
              f"{r.get('cache_creation_input_tokens')} |" + (f" {r['error']}" if "error" in r else ""))
    print(f"\npredicted match grows every turn: {msg['match_grows']}; the filter read {msg['feedback_reports']} "
          f"Anthropic usage reports")
    out["agents"] = {"responses": res, "round_robin_control": ctl, "messages": msg}
    return res["ok"] and msg["ok"] and ctl["follow_up"] == 404
