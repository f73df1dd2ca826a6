"""Priority classes and deadlines at the gate, through the real Envoy.

One pod whose knee is one request, scraping off: the pod's load is exactly this gateway's
in-flight count, so a request that holds the pod (a client that sends and does not read)
keeps every other request at the gate until its client closes. Nothing here depends on
timing: each step waits for the event it needs (a gauge, a counter, a reply) and the
timeouts only guard against a hang.
"""

from __future__ import annotations

import json
import socket
import threading
import time

from warmroute_harness import MODEL, post, words
from warmroute_harness import Fleet as ShippedFleet

# The shipped configs strip the gate's headers from clients; these tests send them as the
# trusted stage before warmroute would (e2e/test_trust.py runs such a stage, jwt_authn).
GATE_HEADERS = ("x-warmroute-priority", "x-warmroute-deadline-ms")


def Fleet(*args, **kwargs) -> ShippedFleet:  # noqa: N802
    return ShippedFleet(*args, trusted_headers=GATE_HEADERS, **kwargs)

KNEE_ONE = {
    "metrics": {"enabled": False},
    "gate": {"knee": {"requests": 1}, "lower_share": 0},
}


def until(what: str, ok, timeout: float = 20.0):
    """Polls `ok()` until it returns a true value (hang guard only)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = ok()
        if v:
            return v
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def body(text: str, max_tokens: int = 4) -> dict:
    return {"model": MODEL, "max_tokens": max_tokens, "messages": [{"role": "user", "content": text}]}


class Holder:
    """A request that holds its pod until `close()`: sent, never read."""

    def __init__(self, port: int, text: str, max_tokens: int = 4000, headers: dict | None = None):
        data = json.dumps(body(text, max_tokens)).encode()
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.sendall(
            (f"POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\n"
             f"{extra}content-length: {len(data)}\r\n\r\n").encode() + data)

    def close(self) -> None:
        self.sock.close()


def gauge(f: ShippedFleet, name: str) -> int:
    return int(f.envoy.stats().get(f"wasmcustom.warmroute.gate.{name}", "0"))


def send_in_order(f: ShippedFleet, requests: list[tuple[str, dict]], queued: str, replies: dict) -> list[threading.Thread]:
    """Sends each request once the previous one is held (so they arrive in this order)."""
    def one(tag: str, headers: dict) -> None:
        replies[tag] = post(f.envoy.port, "/v1/chat/completions", body(f"{tag} {words(tag, 50)}"), headers=headers)

    threads = []
    for n, r in enumerate(requests, start=1):
        threads.append(threading.Thread(target=one, args=r, daemon=True))
        threads[-1].start()
        until(f"{n} {queued} held", lambda: gauge(f, queued) == n)
    return threads


def test_a_saturated_pod_serves_held_interactive_requests_before_batch():
    # Batch asks for earlier deadlines than interactive gets: the class, not the deadline, wins.
    gate = {**KNEE_ONE, "gate": {**KNEE_ONE["gate"], "classes": [
        {"name": "interactive", "max_wait_ms": 60000, "max_queue": 8},
        {"name": "batch", "max_wait_ms": 60000, "max_queue": 8}], "default_class": "batch"}}
    with Fleet(1, filter_overrides=gate) as f:
        pod = f.sims[0]
        holder = Holder(f.envoy.port, words("hold", 20))
        until("the holder on its pod", lambda: pod.metrics().get("vllm:num_requests_running", 0) >= 1)
        replies: dict = {}
        batch = [(f"batch{i}", {"x-warmroute-deadline-ms": "20000"}) for i in range(3)]
        threads = send_in_order(f, batch, "batch.queued", replies)
        chat = [(f"chat{i}", {"x-warmroute-priority": "interactive"}) for i in range(3)]
        threads += send_in_order(f, chat, "interactive.queued", replies)
        assert not replies, "nothing is forwarded while the pod is at its knee"
        holder.close()
        for t in threads:
            t.join(30)
        assert all(r.status == 200 for r in replies.values()), {k: r.status for k, r in replies.items()}
        # The pod takes one request at a time (its knee), so the order its engine admitted
        # them in (the sim numbers its answers in that order) is the order they left the gate.
        served = sorted(replies, key=lambda tag: replies[tag].json()["id"])
        assert served == ["chat0", "chat1", "chat2", "batch0", "batch1", "batch2"], served
        stats = f.envoy.settled_stats()
        assert stats["wasmcustom.warmroute.gate.interactive.released"] == "3"
        assert stats["wasmcustom.warmroute.gate.batch.released"] == "3"


def test_a_passed_deadline_is_a_429_with_retry_after_and_an_openai_error():
    with Fleet(1, filter_overrides=KNEE_ONE) as f:
        pod = f.sims[0]
        holder = Holder(f.envoy.port, words("hold", 20))
        until("the holder on its pod", lambda: pod.metrics().get("vllm:num_requests_running", 0) >= 1)
        start = time.monotonic()
        r = post(f.envoy.port, "/v1/chat/completions", body("late"),
                 headers={"x-warmroute-priority": "interactive", "x-warmroute-deadline-ms": "300"}, timeout=10)
        waited = time.monotonic() - start
        holder.close()
        assert r.status == 429, (r.status, r.body)
        assert r.headers.get("retry-after") == "1"
        err = r.json()["error"]
        assert (err["code"], err["type"]) == ("deadline_exceeded", "rate_limit_error"), err
        # Never before its deadline (the expiry's resolution, one gate check, is a unit test's
        # business: it runs on a clock the test controls).
        assert waited >= 0.3, waited
        assert f.envoy.counter("warmroute.gate.interactive.shed_deadline") == 1
        assert pod.metrics().get("vllm:request_success_total", 0) == 0, "the shed request never reached the pod"


def test_a_client_that_leaves_while_held_is_not_forwarded():
    with Fleet(1, filter_overrides=KNEE_ONE) as f:
        pod = f.sims[0]
        holder = Holder(f.envoy.port, words("hold", 20))
        # The sim counts a prompt's tokens once it is prefilled.
        before = until("the holder prefilled", lambda: pod.metrics().get("vllm:prompt_tokens_total", 0))
        leaver = Holder(f.envoy.port, words("leaver", 777), max_tokens=4)
        until("the leaver held", lambda: gauge(f, "standard.queued") == 1)
        leaver.close()
        until("the leaver's place given up", lambda: gauge(f, "standard.queued") == 0)
        holder.close()
        probe = post(f.envoy.port, "/v1/chat/completions", body("probe"))
        assert probe.status == 200
        after = pod.metrics().get("vllm:prompt_tokens_total", 0)
        assert after - before == probe.json()["usage"]["prompt_tokens"], (before, after)
        assert f.envoy.counter("warmroute.gate.standard.abandoned") == 1


def test_nothing_is_held_below_the_knee():
    gate = {"metrics": {"enabled": False}, "gate": {"knee": {"requests": 4}}}
    with Fleet(2, filter_overrides=gate) as f:
        for i in range(20):
            assert post(f.envoy.port, "/v1/chat/completions", body(f"q{i}")).status == 200
        stats = f.envoy.settled_stats()
        assert stats["wasmcustom.warmroute.gate.standard.admitted"] == "20"
        assert stats["wasmcustom.warmroute.gate.standard.held"] == "0"
