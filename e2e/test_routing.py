"""End to end through the real Envoy with the real dist/warmroute.wasm and simulated vLLM backends."""

from __future__ import annotations

import collections
import http.client
import json
import socket
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from warmroute_harness import MODEL, ROOT, chat, post, words
from warmroute_harness import Fleet as ShippedFleet

FAST = ["--time-scale", "20"]
# These tests read the filter's decision from its debug header, which no shipped config turns on.
DEBUG = {"debug_header": True, "debug_match_counts": True}


def Fleet(*args, filter_overrides: dict | None = None, **kwargs) -> ShippedFleet:  # noqa: N802
    return ShippedFleet(*args, filter_overrides={**DEBUG, **(filter_overrides or {})}, **kwargs)


def system(tag: str, n: int = 600) -> dict:
    return {"role": "system", "content": words(tag, n)}


def debug(reply) -> dict[str, str]:
    return dict(kv.split("=", 1) for kv in reply.headers.get("x-warmroute", "").split(";") if "=" in kv)


@pytest.fixture(scope="module")
def cache_fleet():
    with Fleet(3, FAST) as f:
        yield f


# --- the proxy path (issue 2) -------------------------------------------------------------


def test_non_streaming_bodies_arrive_intact(cache_fleet):
    body = chat(MODEL, [system("intact"), {"role": "user", "content": "hello"}], max_tokens=5)
    r = post(cache_fleet.envoy.port, "/v1/chat/completions", body)
    assert r.status == 200, r.body
    d = r.json()
    assert d["object"] == "chat.completion"
    assert d["usage"]["prompt_tokens"] > 600
    assert d["usage"]["completion_tokens"] == 5
    # The same request straight to the replica that served it gives the same text: nothing was altered.
    sim = next(s for s in cache_fleet.sims if s.name == r.replica)
    direct = post(sim.port, "/v1/chat/completions", body).json()
    assert direct["choices"][0]["message"]["content"] == d["choices"][0]["message"]["content"]
    c = post(cache_fleet.envoy.port, "/v1/completions", {"model": MODEL, "prompt": words("p", 50), "max_tokens": 3})
    assert c.status == 200 and c.json()["object"] == "text_completion"


def test_streaming_is_valid_sse_ending_in_done(cache_fleet):
    conn = http.client.HTTPConnection("127.0.0.1", cache_fleet.envoy.port, timeout=30)
    conn.connect()
    conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    body = chat(MODEL, [system("stream"), {"role": "user", "content": "go"}], max_tokens=6, stream=True,
                stream_options={"include_usage": True})
    conn.request("POST", "/v1/chat/completions", json.dumps(body), {"content-type": "application/json"})
    r = conn.getresponse()
    assert r.status == 200
    assert r.getheader("content-type", "").startswith("text/event-stream")
    events = [e for e in r.read().decode().split("\n\n") if e.strip()]
    assert events[-1] == "data: [DONE]"
    chunks = [json.loads(e.removeprefix("data: ")) for e in events[:-1]]
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c.get("choices"))
    assert len(text.split()) == 6
    assert chunks[-1]["usage"]["completion_tokens"] == 6


# --- routing (issue 3) --------------------------------------------------------------------


@pytest.mark.parametrize("strategy", ["cache_aware", "prefix_hash"])
def test_same_prefix_lands_on_one_backend_and_different_prefixes_spread(strategy):
    with Fleet(3, FAST, filter_overrides={"strategy": strategy}) as f:
        document = words("doc", 800)  # a long shared prefix, e.g. a document asked about many ways
        replies = [post(f.envoy.port, "/v1/chat/completions",
                        chat(MODEL, [system("sys", 50), {"role": "user", "content": f"{document} question {i}"}]))
                   for i in range(8)]
        assert len({r.replica for r in replies}) == 1, [r.replica for r in replies]
        # Not just the same placement: the later requests matched the document's cached blocks.
        matched = [int(debug(r)["match"].split("/")[0]) for r in replies]
        assert matched[0] == 0 and min(matched[1:]) >= 20, matched
        spread = collections.Counter(
            post(f.envoy.port, "/v1/chat/completions",
                 chat(MODEL, [system(f"tenant{i}_"), {"role": "user", "content": "q"}])).replica
            for i in range(24))
        # 24 distinct system prompts, placed by rendezvous on their hash over addresses whose
        # ports change per run (a fresh ~uniform draw): some pod gets none with probability at
        # most 3 (2/3)^24 = 2e-4.
        assert len(spread) == 3, spread


def test_new_conversations_sharing_only_a_system_prompt_spread():
    # The anti-hotspot property: whichever pod first saw a popular system prompt must not
    # attract every new conversation (the failure of fleet-wide-threshold routers).
    # Placement is rendezvous over backend addresses, and the fleet's ports change per run, so
    # the split is a fresh multinomial draw each time: with 60 conversations a fair placement
    # leaves a backend under 8 with probability 3e-4; one pod attracting them all never passes.
    with Fleet(3, FAST) as f:
        counts = collections.Counter(
            post(f.envoy.port, "/v1/chat/completions",
                 chat(MODEL, [system("popular", 1500), {"role": "user", "content": f"task {i}: " + words(f"t{i}_", 30)}])).replica
            for i in range(60))
        assert len(counts) == 3 and min(counts.values()) >= 8, counts


def test_multi_turn_conversation_stays_on_one_backend(cache_fleet):
    messages = [system("conv"), {"role": "user", "content": "turn 0 " + words("u0_", 20)}]
    served, cached = set(), []
    for turn in range(6):
        r = post(cache_fleet.envoy.port, "/v1/chat/completions", chat(MODEL, messages, max_tokens=8))
        assert r.status == 200
        served.add(r.replica)
        d = r.json()
        cached.append(d["usage"]["prompt_tokens_details"]["cached_tokens"])
        messages += [d["choices"][0]["message"], {"role": "user", "content": f"turn {turn + 1} " + words(f"u{turn}_", 20)}]
    assert len(served) == 1, served
    assert all(c > 0 for c in cached[1:]), cached


def test_round_robin_cycles_evenly_across_two_workers():
    with Fleet(3, FAST, filter_overrides={"strategy": "round_robin"}, concurrency=2) as f:
        def one(i):
            return post(f.envoy.port, "/v1/completions", {"model": MODEL, "prompt": f"x {i}", "max_tokens": 1}).replica
        with ThreadPoolExecutor(6) as ex:
            counts = collections.Counter(ex.map(one, range(60)))
        assert sorted(counts.values()) == [20, 20, 20], counts


def test_sticky_session_honours_the_header_and_falls_back():
    with Fleet(3, FAST, filter_overrides={"strategy": "sticky_session"}) as f:
        for sid in ["alice", "bob", "carol", "dave"]:
            got = {post(f.envoy.port, "/v1/completions", {"model": MODEL, "prompt": f"p{i}", "max_tokens": 1},
                        {"x-session-id": sid}).replica for i in range(5)}
            assert len(got) == 1, (sid, got)
        rotation = [post(f.envoy.port, "/v1/completions", {"model": MODEL, "prompt": "same", "max_tokens": 1}).replica
                    for _ in range(6)]
        assert len(set(rotation)) == 3, rotation


def test_least_request_avoids_a_slow_busy_backend():
    with Fleet(3, FAST, filter_overrides={"strategy": "least_request", "metrics": {"enabled": False}}) as f:
        slow = f.sims[0]
        slow.stop()
        slow.args = ["--time-scale", "1", "--base-ms", "200"]
        slow.start(f.logdir)

        def one(i):
            return post(f.envoy.port, "/v1/completions",
                        {"model": MODEL, "prompt": f"req {i}", "max_tokens": 8}).replica
        with ThreadPoolExecutor(6) as ex:
            counts = collections.Counter(ex.map(one, range(60)))
        assert counts[slow.name] < min(counts[s.name] for s in f.sims[1:]) / 2, counts


def test_a_document_another_worker_still_prefills_is_no_hit():
    # Each worker VM knows its own prompts until their first byte and the other's from the
    # shared index log. A prompt that shares a document with one the other worker sent and the
    # pod still prefills gets no hit from it (the pod has not computed those blocks): it must
    # be placed as a new prompt, not counted a hit on the busy pod (the rider of decision 0009).
    # eps 100 turns the load bound off: only the match and the prefill queue decide.
    overrides = {"balance": {"eps": 100}, "metrics": {"period_ms": 100, "timeout_ms": 80}}
    with Fleet(3, ["--time-scale", "0.5"], filter_overrides=overrides, concurrency=2) as f:
        accepted_key = f"listener.127.0.0.1_{f.envoy.port}.worker_{{}}.downstream_cx_total"

        def accepted() -> list[int]:
            st = f.envoy.stats()
            return [int(st.get(accepted_key.format(w), "0")) for w in (0, 1)]

        def gauges(name: str, st: dict[str, str] | None = None) -> dict[str, int]:
            st = st or f.envoy.stats()
            return {s.name: int(st.get(f"wasmcustom.warmroute.backend.{s.name}.{name}", "0")) for s in f.sims}

        def send(body: dict) -> tuple[http.client.HTTPConnection, int]:
            """Sends `body` on a new connection; returns it and the worker that accepted it."""
            before = accepted()
            c = http.client.HTTPConnection("127.0.0.1", f.envoy.port, timeout=60)
            c.request("POST", "/v1/chat/completions", json.dumps(body), {"content-type": "application/json"})
            now = f.envoy.wait_for("the connection accepted", lambda: (a := accepted()) != before and a)
            return c, next(w for w in (0, 1) if now[w] > before[w])

        # ~40k tokens: ~5 s of prefill at time scale 0.5, while each rider takes a connection,
        # an admin read or two (tens of ms) and, 1 in 2^k runs, k riders more.
        doc = words("doc", 40_000)
        first, first_worker = send(chat(MODEL, [{"role": "user", "content": doc + " first"}], max_tokens=1))
        busy, blocks = f.envoy.wait_for("the first prompt's prefill accounted",
                                        lambda: next(((p, n) for p, n in gauges("prefill_blocks").items() if n > 100), None))
        # Riders, each on a new connection, until the other worker has taken one. Connections
        # are spread over the workers by the kernel's port hash: each lands on the other worker
        # with probability ~1/2, so 20 all on one worker is ~1e-6.
        riders = []
        for i in range(20):
            c, worker = send(chat(MODEL, [{"role": "user", "content": doc + f" rider {i}"}], max_tokens=1))
            riders.append((c, worker))
            if worker != first_worker:
                break
        assert riders[-1][1] != first_worker, "every rider went to the first prompt's worker"
        # Every rider routed while the first still prefills, each accounted its whole prefill
        # (about the first's), not the few blocks past the document a hit would leave.
        st = f.envoy.wait_for("the riders routed",
                              lambda: (st := f.envoy.stats()) and sum(gauges("inflight", st).values()) == 1 + len(riders) and st)
        pending = gauges("prefill_blocks", st)
        assert pending[busy] >= blocks, ("the first prompt answered before the riders were routed", pending)
        assert sum(pending.values()) >= blocks * (1 + 0.9 * len(riders)), ("riders accounted as hits", blocks, pending)
        replies = []
        for c, worker in [(first, first_worker)] + riders:
            r = c.getresponse()
            replies.append((r.status, debug(r), worker))
            r.read()
            c.close()
        assert all(status == 200 for status, _, _ in replies), replies
        assert all(d["match"].startswith("0/") and d["reason"] == "placed" for _, d, _ in replies[1:]), replies
        # The first two riders always have an idle pod to take; from the third on, every pod
        # may hold one prompt of the document, and the busy pod is as short a queue as any.
        assert all(d["backend"] != busy for _, d, _ in replies[1:3]), (busy, replies)


def test_hot_prefix_spills_over_to_a_second_backend():
    # Saturation at 3 in flight makes the bound bite with few requests.
    with Fleet(3, ["--time-scale", "2"], filter_overrides={"saturation": {"max_inflight": 3}}) as f:
        def one(i):
            return post(f.envoy.port, "/v1/chat/completions",
                        chat(MODEL, [system("sys", 50), {"role": "user", "content": words("hotdoc", 800) + f" ask {i}"}],
                             max_tokens=40))
        # One first, answered: while its prefill is pending the document is no hit
        # anywhere, and the others would be placed as new prompts, not spilled.
        assert one(-1).status == 200
        with ThreadPoolExecutor(9) as ex:
            replies = list(ex.map(one, range(9)))
        assert all(r.status == 200 for r in replies)
        assert len({r.replica for r in replies}) >= 2, [r.replica for r in replies]
        assert any(debug(r).get("reason") == "spillover" for r in replies)
        assert f.envoy.counter("warmroute.decision.spillover") > 0


def test_a_client_sent_routing_header_is_ignored():
    with Fleet(3, FAST, filter_overrides={"strategy": "prefix_hash"}) as f:
        for i in range(6):
            body = chat(MODEL, [system(f"pin{i}_"), {"role": "user", "content": "q"}])
            target = f.sims[i % 3]
            r = post(f.envoy.port, "/v1/chat/completions", body,
                     {"x-gateway-destination-endpoint": target.address, "x-warmroute-backend": target.name})
            assert r.status == 200
            assert r.replica == debug(r)["backend"], "the filter's choice, not the client's, was served"
        # Mixed: the filter's choices differ from the client's request at least once. Placement
        # is a fresh draw per run (rendezvous over this run's ports): 8 prompts all on the named
        # pod with probability (1/3)^8 = 2e-4.
        picks = {debug(post(f.envoy.port, "/v1/chat/completions",
                            chat(MODEL, [system(f"pin{i}_"), {"role": "user", "content": "q"}]),
                            {"x-gateway-destination-endpoint": f.sims[0].address}))["backend"] for i in range(8)}
        assert picks != {f.sims[0].name}


@pytest.mark.parametrize(
    "body, fallback",
    [
        (b"{this is not json", "not_json"),
        (b"\xff\xfe binary \x00 garbage", "not_json"),
        (b'{"model": "sim-llama-8b", "messages": "wrong type"}', "bad_shape"),
    ],
)
def test_malformed_bodies_are_proxied_and_answered(cache_fleet, body, fallback):
    r = post(cache_fleet.envoy.port, "/v1/chat/completions", body)
    assert r.replica is not None, "the backend answered"
    assert r.status == 400
    assert debug(r)["fallback"] == fallback


def test_oversized_and_compressed_bodies_are_proxied():
    with Fleet(3, FAST, filter_overrides={"max_body_bytes": 4096}) as f:
        big = chat(MODEL, [{"role": "user", "content": words("big", 3000)}], max_tokens=2)
        r = post(f.envoy.port, "/v1/chat/completions", big)
        assert r.status == 200 and r.json()["usage"]["prompt_tokens"] > 3000
        assert debug(r)["fallback"] == "too_large"
        g = post(f.envoy.port, "/v1/chat/completions", chat(MODEL, [{"role": "user", "content": "hi"}]),
                 {"content-encoding": "gzip"})
        assert g.replica is not None
        assert debug(g)["fallback"] == "compressed"
        assert f.envoy.counter("warmroute.fallback.too_large") == 1


def test_cache_aware_beats_round_robin_on_fleet_hit_rate():
    rates = {}
    for strategy in ["round_robin", "cache_aware"]:
        with Fleet(3, FAST, filter_overrides={"strategy": strategy}) as f:
            def conversation(c):
                messages = [system("assist", 50), {"role": "user", "content": f"user {c} " + words(f"c{c}_", 100)}]
                for turn in range(6):
                    r = post(f.envoy.port, "/v1/chat/completions", chat(MODEL, messages, max_tokens=20))
                    assert r.status == 200
                    messages += [r.json()["choices"][0]["message"],
                                 {"role": "user", "content": f"turn {turn} " + words(f"c{c}t{turn}_", 100)}]
            with ThreadPoolExecutor(4) as ex:
                list(ex.map(conversation, range(12)))
            hits, queries = f.hit_counters()
            rates[strategy] = hits / queries
    # Ideal affinity hits all but each turn's new ~120 tokens (~80%); round robin only what
    # the same pod kept from three turns earlier.
    print("hit rates", rates)
    assert rates["cache_aware"] > rates["round_robin"] + 0.15, rates


@pytest.mark.parametrize("variant, mode", [("deploy/envoy/envoy-header.yaml", "header"), ("deploy/envoy/envoy-authority.yaml", "authority")])
def test_every_route_mode_routes_end_to_end(variant, mode):
    with Fleet(3, FAST, config_file=ROOT / variant, filter_overrides={"strategy": "prefix_hash"}) as f:
        served = collections.Counter()
        for i in range(12):
            r = post(f.envoy.port, "/v1/chat/completions", chat(MODEL, [system(f"{mode}{i}_"), {"role": "user", "content": "q"}]))
            assert r.status == 200
            assert r.replica == debug(r)["backend"], (mode, r.headers)
            served[r.replica] += 1
        # 12 distinct prompts all on one pod of 3: probability 3 (1/3)^12 = 6e-6.
        assert len(served) >= 2, served


def test_inflight_is_released_on_every_outcome():
    with Fleet(3, ["--time-scale", "1"], filter_overrides={"metrics": {"period_ms": 200, "timeout_ms": 150}}) as f:
        # A client that resets mid-stream.
        for i in range(3):
            conn = http.client.HTTPConnection("127.0.0.1", f.envoy.port, timeout=10)
            body = chat(MODEL, [{"role": "user", "content": f"reset {i} " + words("r", 50)}], max_tokens=200, stream=True)
            conn.request("POST", "/v1/chat/completions", json.dumps(body), {"content-type": "application/json"})
            r = conn.getresponse()
            r.read1(64)
            conn.sock.close()
        # Upstream 4xx, success, and an upstream that dies mid-request.
        assert post(f.envoy.port, "/v1/chat/completions", b"{bad").status == 400
        assert post(f.envoy.port, "/v1/completions", {"model": MODEL, "prompt": "ok", "max_tokens": 1}).status == 200
        with ThreadPoolExecutor(3) as ex:
            slow = [ex.submit(post, f.envoy.port, "/v1/completions",
                              {"model": MODEL, "prompt": f"dying {i}", "max_tokens": 400}, None, 30) for i in range(3)]
            # All three running (400 decode steps: seconds at time scale 1); the pod that runs
            # one dies under it.
            def running() -> dict[str, float]:
                n = {s.name: s.metrics().get("vllm:num_requests_running", 0) for s in f.sims}
                return n if sum(n.values()) >= 3 else {}
            running_on = f.envoy.wait_for("the three long requests running", running)
            next(s for s in f.sims if running_on[s.name] > 0).stop()
            outcomes = [s.result().status for s in slow]
        assert outcomes, outcomes

        def released() -> dict[str, str]:
            stats = f.envoy.stats()
            return stats if all(stats.get(f"wasmcustom.warmroute.backend.{s.name}.inflight") == "0"
                                for s in f.sims) else {}
        stats = f.envoy.wait_for("every pod's in-flight gauge back at 0", released)
        prefill = {s.name: stats.get(f"wasmcustom.warmroute.backend.{s.name}.prefill_blocks") for s in f.sims}
        assert all(v == "0" for v in prefill.values()), prefill
        seen = {k.rsplit(".", 1)[1]: int(v) for k, v in f.envoy.settled_stats().items() if ".requests.cache_aware." in k}
        assert sum(seen.values()) == 8, ("every request is counted once", seen)
        assert seen["reset"] >= 1 and seen["4xx"] == 1, seen


def test_a_long_prefill_diverts_new_prompts_until_its_first_byte():
    # eps 100 turns the load bound off: only the prefill queue can keep prompts off the busy pod.
    overrides = {"balance": {"eps": 100}, "metrics": {"period_ms": 100, "timeout_ms": 80}}
    with Fleet(3, ["--time-scale", "0.5"], filter_overrides=overrides) as f:
        def gauge(pod: str, name: str) -> int:
            return int(f.envoy.stats().get(f"wasmcustom.warmroute.backend.{pod}.{name}", "0"))

        # ~40k tokens: ~5 s of prefill at time scale 0.5, then 150 decode steps.
        conn = http.client.HTTPConnection("127.0.0.1", f.envoy.port, timeout=60)
        long_body = chat(MODEL, [{"role": "user", "content": words("long", 40_000)}], max_tokens=150, stream=True)
        with ThreadPoolExecutor(1) as ex:
            conn.request("POST", "/v1/chat/completions", json.dumps(long_body), {"content-type": "application/json"})
            reply = ex.submit(conn.getresponse)
            busy = f.envoy.wait_for("the long prompt's prefill accounted",
                                    lambda: next((s.name for s in f.sims if gauge(s.name, "prefill_blocks") > 1000), None))
            # Twelve new conversations while it prefills: rendezvous alone would put ~4 on it.
            chosen = []
            for i in range(12):
                body = chat(MODEL, [{"role": "user", "content": f"short {i} " + words(f"s{i}x", 30)}], max_tokens=1)
                r = post(f.envoy.port, "/v1/chat/completions", body)
                assert r.status == 200, r.body
                chosen.append(debug(r)["backend"])
            assert busy not in chosen, (busy, chosen)
            assert gauge(busy, "prefill_blocks") > 1000, "still prefilling while they were routed"
            r = reply.result(timeout=30)
            assert r.status == 200
            assert r.read1(64).startswith(b"data:")
            # First token out: its prefill no longer counts, the request still does until it ends
            # (150 decode steps: seconds at this time scale). Both gauges from one snapshot.
            key = f"wasmcustom.warmroute.backend.{busy}."
            stats = f.envoy.wait_for("the prefill released at the first byte",
                                     lambda: (st := f.envoy.stats()).get(key + "prefill_blocks") == "0" and st)
            assert stats.get(key + "inflight") == "1", stats.get(key + "inflight")
            r.read()
        conn.close()
