"""The ext_proc floor the overhead bench measures warmroute against, through the real Envoy:
a request passes the hop whole, and the picker's header reaches the pod and routes it.

    cd bench && ../.venv/bin/python -m pytest -q test_extproc_floor.py

Part of `make bench-cost` (not `make test`: the picker's crate takes minutes to build from
nothing). Three sims echo the request headers they receive (`--echo-request-headers`); the
picker picks endpoint `len(body) % 3`, so each test knows the pod a request must reach.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest

from extproc import EXTPROC_PACKAGE, ExtProcEnvoy
from overhead import cargo_build
from warmroute_harness import MODEL, Sim, chat, free_port, post, words

ECHO = ["--time-scale", "20", "--echo-request-headers"]


@pytest.fixture(scope="module")
def gateway():
    picker = cargo_build("-p", EXTPROC_PACKAGE)
    logdir = Path(tempfile.mkdtemp(prefix="extproc-floor-"))
    sims = [Sim(f"sim-{i}", free_port(), ECHO) for i in range(3)]
    gw = ExtProcEnvoy(sims, concurrency=1, picker_bin=picker)
    try:
        for s in sims:
            s.start(logdir)
        gw.start(logdir)
        yield gw
    finally:
        gw.stop()
        for s in sims:
            s.stop()


def body_for(target: int, tag: str, n_words: int) -> bytes:
    """A chat body of `n_words` prompt words whose length is `target` modulo 3 (padded with
    spaces after the JSON, which every parser skips)."""
    b = json.dumps(chat(MODEL, [{"role": "user", "content": words(tag, n_words)}])).encode()
    return b + b" " * ((target - len(b)) % 3)


def seen(reply) -> dict[str, str]:
    return dict(tuple(p) for p in json.loads(reply.headers["x-sim-request-headers"]))


def test_each_request_reaches_the_pod_the_picker_named(gateway):
    # Two requests in a row to one pod: Envoy's round robin (what routes when the header is
    # missing) never sends consecutive requests to the same one of 3 pods, so it cannot pass.
    for i, target in enumerate([2, 2, 0, 1, 1, 0]):
        body = body_for(target, f"t{i}x", 40)
        r = post(gateway.port, "/v1/chat/completions", body, timeout=20)
        assert r.status == 200, (r.status, r.body[:300], gateway.log_warnings())
        pod = gateway.sims[target]
        assert r.replica == pod.name, (i, r.replica, pod.name)
        got = seen(r)
        assert got.get("x-gateway-destination-endpoint") == pod.address, got
        # The body reached the pod whole: it counts the prompt as the pod asked directly does.
        direct = post(pod.port, "/v1/chat/completions", body, timeout=20)
        assert r.json()["usage"]["prompt_tokens"] == direct.json()["usage"]["prompt_tokens"], r.json()


def test_a_128k_body_and_a_streamed_answer_pass_the_hop(gateway):
    # 128 KB crosses the hop's 64 KiB HTTP/2 stream window in several messages each way; the
    # streamed answer comes back through the picker chunk by chunk.
    n = 16000
    body = body_for(1, "big", n)
    assert len(body) > 128 * 1024, len(body)
    data = json.loads(body)
    data["stream"] = True
    data["stream_options"] = {"include_usage": True}
    body = json.dumps(data).encode()
    body += b" " * ((1 - len(body)) % 3)
    r = post(gateway.port, "/v1/chat/completions", body, timeout=30)
    assert r.status == 200, (r.status, r.body[:300], gateway.log_warnings())
    pod = gateway.sims[1]
    assert r.replica == pod.name
    assert seen(r).get("x-gateway-destination-endpoint") == pod.address
    events = [line[6:] for line in r.body.decode().splitlines() if line.startswith("data: ")]
    assert events and events[-1] == "[DONE]", r.body[-300:]
    usage = [json.loads(e)["usage"] for e in events[:-1] if json.loads(e).get("usage")]
    direct = post(pod.port, "/v1/chat/completions", body, timeout=30)
    want = [json.loads(line[6:])["usage"] for line in direct.body.decode().splitlines()
            if line.startswith("data: {") and json.loads(line[6:]).get("usage")]
    assert usage and want and usage[-1]["prompt_tokens"] == want[-1]["prompt_tokens"] >= n, (usage, want)
