"""The APIs agents speak, through the real Envoy and the real filter: `/v1/responses` follow-ups
by `previous_response_id` (the stored response lives only on the pod that answered it) and
Anthropic's `/v1/messages` (whose turns must extend each other's prefix).
"""

from __future__ import annotations

import json

from warmroute_harness import MODEL, Fleet, post, words

DEBUG = {"debug_header": True, "debug_match_counts": True}
STORE = ["--enable-responses-store", "--time-scale", "20"]


def note(reply) -> dict[str, str]:
    return dict(kv.split("=", 1) for kv in reply.headers.get("x-warmroute", "").split(";") if "=" in kv)


def events(reply) -> list[tuple[str, dict]]:
    """A server-sent stream's events: (event name, data)."""
    out = []
    for block in reply.body.decode().split("\n\n"):
        fields = dict(line.split(":", 1) for line in block.splitlines() if ":" in line)
        if "data" in fields:
            out.append((fields.get("event", "").strip(), json.loads(fields["data"])))
    return out


def respond(port: int, body: dict):
    """One /v1/responses request, streamed or not: (reply, the response object as it ended)."""
    reply = post(port, "/v1/responses", body)
    if reply.status != 200:
        return reply, None
    if body.get("stream"):
        done = [d["response"] for name, d in events(reply) if name == "response.completed"]
        return reply, done[-1] if done else None
    return reply, reply.json()


def test_a_responses_conversation_follows_its_stored_response_every_turn():
    # 10 turns, each naming the previous answer; each turn on a fresh connection (Envoy hands
    # them to its 2 workers as the kernel spreads them), streamed and not in turn.
    instructions = words("rules", 300)
    with Fleet(3, STORE, filter_overrides=DEBUG) as f:
        previous, holder = None, None
        cached = []
        for turn in range(10):
            body = {"model": MODEL, "instructions": instructions, "input": words(f"turn{turn}x", 60),
                    "max_output_tokens": 8, "stream": turn % 2 == 1}
            if previous:
                body["previous_response_id"] = previous
            reply, done = respond(f.envoy.port, body)
            assert reply.status == 200, (turn, reply.body[:300])
            assert done and done["status"] in ("completed", "incomplete"), (turn, done)
            if turn == 0:
                holder = reply.replica
            else:
                assert reply.replica == holder, (turn, reply.replica, holder)
                assert note(reply)["reason"] == "stored_response", (turn, reply.headers)
                assert note(reply)["previous_response"] == "holder"
                cached.append(done["usage"]["input_tokens_details"]["cached_tokens"])
            previous = done["id"]
        # Every follow-up read the conversation so far from its pod's cache, more each turn.
        assert all(b > a for a, b in zip(cached, cached[1:])), cached
        assert f.envoy.counter("warmroute.decision.stored_response") == 9
        assert f.envoy.counter("warmroute.responses.holder") == 9
        assert f.envoy.counter("warmroute.responses.remembered") == 10
        # A follow-up's usage counts the stored conversation its key does not: not read.
        assert f.envoy.counter("warmroute.feedback.reports") == 0


def test_responses_that_carry_their_whole_prompt_are_checked_against_the_pods_report():
    # Requests without previous_response_id sharing their instructions, streamed and not. The
    # shared prefix is copied to every pod as the policy spreads it (a placement each: at most
    # 3, whatever the timing), and every other request is a predicted hit, whose answer's usage
    # is checked against the prediction.
    instructions = words("policy", 300)
    with Fleet(3, ["--time-scale", "20"], filter_overrides=DEBUG) as f:
        hits = []
        for i in range(8):
            body = {"model": MODEL, "instructions": instructions, "input": words(f"ask{i}x", 40),
                    "max_output_tokens": 8, "store": False, "stream": i % 2 == 1}
            reply, done = respond(f.envoy.port, body)
            assert reply.status == 200, (i, reply.body[:300])
            if int(note(reply)["match"].split("/")[0]) > 0:
                hits.append(done["usage"]["input_tokens_details"]["cached_tokens"])
        assert len(hits) >= 5 and all(c > 0 for c in hits), hits
        assert f.envoy.counter("warmroute.feedback.reports") == len(hits)
        assert f.envoy.counter("warmroute.feedback.evictions") == 0


def test_without_the_filter_the_first_follow_up_reaches_another_pod_and_fails():
    # The control: Envoy's own round robin on one worker sends the follow-up to the next pod,
    # which does not hold the response (vLLM answers 404 there).
    with Fleet(3, STORE, with_filter=False, lb="round_robin", concurrency=1) as f:
        _, first = respond(f.envoy.port, {"model": MODEL, "input": words("q", 50), "max_output_tokens": 4})
        reply, _ = respond(f.envoy.port, {"model": MODEL, "input": "and then?", "max_output_tokens": 4,
                                          "previous_response_id": first["id"]})
        assert reply.status == 404, reply.body[:200]
        assert b"not found" in reply.body


def test_a_follow_up_whose_holder_is_down_or_unknown_routes_as_usual_and_says_why():
    with Fleet(3, STORE, filter_overrides=DEBUG) as f:
        e = f.envoy
        # An id no pod answered: routed as usual; the pod answers as vLLM would.
        reply, _ = respond(e.port, {"model": MODEL, "input": "x", "previous_response_id": "resp_made_up"})
        assert reply.status == 404
        assert note(reply)["previous_response"] == "unknown"
        assert note(reply)["reason"] != "stored_response"
        # A stored response whose pod then stops: once the filter has it out of rotation, the
        # follow-up is routed as usual (another pod answers 404, as vLLM's would).
        reply, first = respond(e.port, {"model": MODEL, "input": words("q", 50), "max_output_tokens": 4})
        victim = next(s for s in f.sims if s.name == reply.replica)
        failed = lambda: e.host_stats("pool-metrics").get(victim.port, {}).get("rq_error", 0)  # noqa: E731
        before = failed()
        victim.stop()
        # Out of rotation after the shipped metrics.unhealthy_after (2) failed scrapes, counted
        # by Envoy as they end; seen by every VM within 2 more ticks of the scraping one.
        e.wait_for(f"2 failed scrapes of {victim.name}", lambda: failed() >= before + 2)
        e.wait_ticks(2)
        reply, _ = respond(e.port, {"model": MODEL, "input": "and then?", "previous_response_id": first["id"]})
        assert reply.status == 404 and reply.replica != victim.name, (reply.status, reply.replica)
        assert note(reply)["previous_response"] == "holder_down"
        assert e.counter("warmroute.responses.unknown") == 1
        assert e.counter("warmroute.responses.holder_down") == 1
        assert e.counter("warmroute.decision.stored_response") == 0


def test_messages_turns_extend_each_other():
    # An agent on Anthropic's Messages API: a shared system prompt in text blocks, tools, and
    # each step a tool_use answered by a tool_result. Each turn's predicted match grows: the
    # filter hashed turn N+1 as an extension of turn N.
    tools = [{"name": "read_file", "description": "Reads a file", "input_schema": {"type": "object"}}]
    system = [{"type": "text", "text": words("sys", 200)}]
    with Fleet(3, ["--time-scale", "20"], filter_overrides=DEBUG) as f:
        messages = [{"role": "user", "content": words("task", 120)}]
        matched, pods, reads = [], set(), []
        for turn in range(6):
            body = {"model": MODEL, "max_tokens": 6, "system": system, "tools": tools, "messages": messages,
                    "stream": turn % 2 == 1}
            reply = post(f.envoy.port, "/v1/messages", body)
            assert reply.status == 200, (turn, reply.body[:300])
            fields = note(reply)
            assert "fallback" not in fields, fields
            matched.append(int(fields["match"].split("/")[0]))
            pods.add(reply.replica)
            if body["stream"]:
                evs = events(reply)
                text = "".join(d["delta"]["text"] for n, d in evs if n == "content_block_delta")
                usage = next(d["usage"] for n, d in evs if n == "message_delta")
            else:
                answer = reply.json()
                text, usage = answer["content"][0]["text"], answer["usage"]
            reads.append(usage["cache_read_input_tokens"])
            messages.append({"role": "assistant", "content": [
                {"type": "text", "text": text},
                {"type": "tool_use", "id": f"toolu_{turn}", "name": "read_file", "input": {"path": f"f{turn}.rs"}}]})
            messages.append({"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": f"toolu_{turn}", "content": words(f"out{turn}x", 80)}]})
        assert all(b > a for a, b in zip(matched, matched[1:])), matched
        assert len(pods) == 1, pods
        assert all(r > 0 for r in reads[1:]), reads
        # The pod's Anthropic usage reports were read against the predictions.
        assert f.envoy.counter("warmroute.feedback.reports") >= 4
