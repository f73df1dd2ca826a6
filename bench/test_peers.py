"""Each peer router the bench compares with starts in front of the simulated fleet and routes.

    cd bench && ../.venv/bin/python -m pytest -q test_peers.py

Part of `make bench` and `make bench-peers` (not `make test`: the routers come from PyPI into
.venv-peers, `make peers-setup`). For every row of `PEER_ROUTERS`: the router starts on 127.0.0.1
in front of 3 sims and counts them healthy (`PeerRouter` waits for that), a chat request comes
back whole, a streamed one as server-sent events ending in `[DONE]`, and requests sharing a long
prefix (and a session id) land on the pod that served the first and hit its prefix cache. That
last check is deterministic: the requests go one at a time, so the loads stay equal and the
cache-aware policies follow the prefix (match ratio ~0.98 over thresholds of 0.1-0.5), and
consistent_hash follows the session id; a router spreading requests (round robin over 3 pods)
cannot send 5 in a row to one pod.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest

from peers import PeerRouter
from scenarios import PEER_ROUTERS
from warmroute_harness import MODEL, Sim, chat, free_port, post, words


@pytest.fixture(params=list(PEER_ROUTERS))
def peer(request):
    logdir = Path(tempfile.mkdtemp(prefix="peers-"))
    sims = [Sim(f"sim-{i}", free_port(), ["--time-scale", "20"]) for i in range(3)]
    try:
        for s in sims:
            s.start(logdir)
        with PeerRouter(request.param, sims, logdir) as p:
            yield p
    finally:
        for s in sims:
            s.stop()


def port_of(p: PeerRouter) -> int:
    return int(p.url.rsplit(":", 1)[1])


def test_the_peer_routes_streams_and_follows_the_prefix(peer):
    prefix = words("shared", 400)
    session = {"x-session-id": "s-1"}
    first = post(port_of(peer), "/v1/chat/completions",
                 chat(MODEL, [{"role": "system", "content": prefix}, {"role": "user", "content": "q0"}]),
                 headers=session, timeout=20)
    assert first.status == 200, (first.status, first.body[:300])
    assert first.json()["choices"][0]["message"]["content"]
    home = first.replica
    assert home in {"sim-0", "sim-1", "sim-2"}
    for i in range(1, 5):
        r = post(port_of(peer), "/v1/chat/completions",
                 chat(MODEL, [{"role": "system", "content": prefix}, {"role": "user", "content": f"q{i}"}]),
                 headers=session, timeout=20)
        assert r.status == 200, (r.status, r.body[:300])
        assert r.replica == home, (i, r.replica, home)
        assert r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] >= 400
    s = post(port_of(peer), "/v1/chat/completions",
             chat(MODEL, [{"role": "user", "content": words("stream", 20)}], stream=True, max_tokens=5),
             timeout=20)
    assert s.status == 200, (s.status, s.body[:300])
    events = [line[len("data: "):] for line in s.body.decode().splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]", events[-3:]
    text = "".join(json.loads(e)["choices"][0]["delta"].get("content") or "" for e in events[:-1]
                   if json.loads(e)["choices"])
    assert len(text.split()) == 5, text
