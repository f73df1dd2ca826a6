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
    """A request that holds its pod until `close()`: sent, never read. `stream`: ask for the
    answer as a stream; `rcvbuf`: a small receive window, so an unread stream backs up into
    Envoy and the pod at once."""

    def __init__(self, port: int, text: str, max_tokens: int = 4000, headers: dict | None = None,
                 stream: bool = False, rcvbuf: int | None = None):
        data = json.dumps({**body(text, max_tokens), **({"stream": True} if stream else {})}).encode()
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        self.sock = socket.socket()
        if rcvbuf:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.connect(("127.0.0.1", port))
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


def test_a_compressed_body_waits_its_turn_at_a_saturated_pod():
    # The gate cannot read a gzip body, but Envoy holds it whole (it is within max_body_bytes):
    # it waits in its class's queue like any other request, not ahead of them at a pod past its knee.
    import gzip
    with Fleet(1, filter_overrides=KNEE_ONE) as f:
        pod = f.sims[0]
        holder = Holder(f.envoy.port, words("hold", 20))
        until("the holder on its pod", lambda: pod.metrics().get("vllm:num_requests_running", 0) >= 1)
        replies: dict = {}
        threads = send_in_order(f, [("plain", {})], "standard.queued", replies)

        def compressed() -> None:
            data = gzip.compress(json.dumps(body(words("zipped", 50))).encode())
            replies["zipped"] = post(f.envoy.port, "/v1/chat/completions", data,
                                     headers={"content-encoding": "gzip"})
        threads.append(threading.Thread(target=compressed, daemon=True))
        threads[-1].start()
        until("the compressed request held", lambda: gauge(f, "standard.queued") == 2)
        assert not replies, "nothing is forwarded while the pod is at its knee"
        holder.close()
        for t in threads:
            t.join(30)
        assert replies["plain"].status == 200
        # The pod, like vLLM, does not decompress request bodies: a 400 from the pod itself.
        assert replies["zipped"].status == 400 and replies["zipped"].replica is not None
        assert f.envoy.counter("warmroute.fallback.compressed") == 1


def test_clients_that_stop_reading_do_not_pin_the_knee():
    # Two long streams whose clients never read: the pod finishes both (vLLM's engine, like
    # the sim's, does not wait for the HTTP writer), but they stay in flight here while their
    # connections stay open. The knee (2 requests) must believe the fresh scrape showing the
    # pod idle, not this gateway's count. 60k tokens (~12 MB each as SSE) is more than every
    # buffer between the pod and the client holds (Envoy's 1 MiB per connection, the kernel's
    # socket buffers), so the streams cannot drain unread.
    gate = {"metrics": {"period_ms": 200, "timeout_ms": 150},
            "gate": {"knee": {"requests": 2}, "lower_share": 0}}
    with Fleet(1, ["--time-scale", "600"], filter_overrides=gate) as f:
        pod = f.sims[0]
        streams = [Holder(f.envoy.port, words(f"unread{i}", 20), 60000, stream=True, rcvbuf=4096)
                   for i in range(2)]
        until("the pod finished both streams",
              lambda: pod.metrics().get("vllm:request_success_total", 0) == 2, timeout=60)
        assert pod.metrics().get("vllm:num_requests_running", 0) == 0
        assert f.envoy.stats()["wasmcustom.warmroute.backend.sim-0.inflight"] == "2"
        # A scrape that started after both finished: the second one from now.
        scrapes = f.envoy.counter("warmroute.scrape.ok")
        until("two more scrapes", lambda: f.envoy.counter("warmroute.scrape.ok") >= scrapes + 2)
        r = post(f.envoy.port, "/v1/chat/completions", body("next"),
                 headers={"x-warmroute-deadline-ms": "3000"}, timeout=30)
        for s in streams:
            s.close()
        assert r.status == 200, (r.status, r.body[:200])
        assert f.envoy.counter("warmroute.gate.standard.held") == 0



MiB = 1 << 20


def status_line(sock: socket.socket, timeout: float | None) -> int | None:
    """The status of the reply on `sock` (its first line read), or None if none begins within
    `timeout`."""
    sock.settimeout(timeout)
    got = b""
    try:
        while b"\r\n" not in got:
            more = sock.recv(256)
            if not more:
                break
            got += more
    except socket.timeout:
        if not got:
            return None
        raise
    finally:
        sock.settimeout(None)
    assert got.startswith(b"HTTP/1.1 "), got[:80]
    return int(got.split(b" ", 2)[1])


def test_held_bodies_stay_within_the_byte_budget_and_small_requests_are_answered():
    # 100 complete 7 MiB HTTP/1 bodies while the only pod is past its knee. With the default
    # classes the standard class would hold 256 of them (1.75 GiB): only the gate's byte budget
    # keeps Envoy's memory bounded (the overload manager cannot reset HTTP/1 streams; past 95 %
    # of its heap it refuses every new request, small ones too).
    #
    # Sent one at a time, each once the previous one is held or answered: what stays in Envoy is
    # then the held bodies, plus the one body being read. The bound on Envoy's RSS is computed
    # from the config and this run: its RSS before the first body (code, VMs, the holder), plus
    # the gate's max_held_bytes, plus what the VMs' linear memory grew by (each worker reads a
    # whole body into its VM, whose memory never shrinks; read from /proc/<pid>/maps), plus two
    # bodies (the one being read, and the one a 429's stream frees only after its reply, at
    # Envoy's deferred delete). Measured: peak 152-153 MiB over the idle RSS, 126 MiB held.
    n, size = 100, 7 * MiB
    with Fleet(1, filter_overrides=KNEE_ONE) as f:
        e, pod = f.envoy, f.sims[0]
        budget = e.filter["gate"].get("max_held_bytes", 128 * MiB)  # the filter's default when unset
        max_body = e.filter.get("max_body_bytes", 8 * MiB)  # likewise
        data = json.dumps({**body("", 1), "messages": [{"role": "user", "content": "x" * size}]}).encode()
        head = (f"POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\n"
                f"content-length: {len(data)}\r\n\r\n").encode()
        # The premises: the filter reads each body whole, and the class's queue alone would hold all.
        assert size < len(data) <= max_body
        assert n * len(data) > budget and n <= 256
        holder = Holder(e.port, words("hold", 20))
        until("the holder on its pod", lambda: pod.metrics().get("vllm:num_requests_running", 0) >= 1)
        idle, vms_idle = e.rss_bytes(), e.wasm_memories()
        peak = idle
        held: list[socket.socket] = []
        shed, refused = 0, None
        for i in range(n):
            s = socket.create_connection(("127.0.0.1", e.port))
            try:
                s.sendall(head + data)
            except OSError as err:  # Envoy refusing requests (overload manager): no answer at all
                refused = f"body {i}: {err}"
                s.close()
                break
            while True:
                status = status_line(s, 0.02)
                peak = max(peak, e.rss_bytes())
                if status is not None:
                    assert status == 429, f"body {i} answered {status} while the pod is at its knee"
                    shed += 1
                    s.close()
                    break
                if gauge(f, "standard.queued") == len(held) + 1:
                    held.append(s)
                    break
        vms = e.wasm_memories()
        grown = sum(vms.values()) - sum(vms_idle.get(a, 0) for a in vms)
        bound = idle + budget + grown + 2 * len(data)
        print(f"RSS idle {idle / MiB:.0f} MiB, peak {peak / MiB:.0f} MiB, bound {bound / MiB:.0f} MiB "
              f"(max_held_bytes {budget / MiB:.0f} MiB, VMs grew {grown / MiB:.1f} MiB); "
              f"held {len(held)}, shed {shed}, refused: {refused}")
        assert peak <= bound, f"RSS peaked at {peak / MiB:.0f} MiB, over the {bound / MiB:.0f} MiB bound"
        assert refused is None, f"Envoy refused a request: {refused}"
        # Each worker's VM grew by its read of one body, not by what it holds.
        assert all(vms[a] - vms_idle.get(a, 0) <= 2 * len(data) for a in vms), (vms_idle, vms)
        assert len(held) == budget // len(data) and shed == n - len(held), (len(held), shed)

        # Small requests still fit the budget: they wait (interactive, ahead of the held bodies)
        # and are answered once the pod has room.
        replies: dict = {}
        small = [(f"small{i}", {"x-warmroute-priority": "interactive"}) for i in range(3)]
        threads = send_in_order(f, small, "interactive.queued", replies)
        holder.close()
        for t in threads:
            t.join(30)
        assert {k: r.status for k, r in replies.items()} == {tag: 200 for tag, _ in small}
        for s in held:
            assert status_line(s, 30) == 200
            s.close()
        stats = e.settled_stats()
        assert stats["wasmcustom.warmroute.gate.standard.shed_queue_full"] == str(shed)
        assert stats["wasmcustom.warmroute.gate.standard.released"] == str(len(held))
        assert stats["wasmcustom.warmroute.gate.interactive.released"] == "3"
        assert gauge(f, "standard.queued") == 0 and gauge(f, "interactive.queued") == 0
