"""Replicas of one gateway learn from each other (deploy/envoy/envoy-peers.yaml): three real
Envoys with the real .wasm in front of the same simulated pods, each pulling the others' recent
index events through its own `warmroute-peers` cluster. A client's turns spread over the
replicas still find the pod that holds the conversation; a replica started mid-run routes
warm; a stored response's follow-up through any replica reaches the pod that holds it; a dead
peer and one that answers garbage change nothing for clients.

Every wait counts events (a replica's imported events, its peers' pulls), never a sleep."""

from __future__ import annotations

import http.client
import http.server
import threading

from warmroute_harness import MODEL, ROOT, Fleet, chat, free_port, post, words

PEERS = ROOT / "deploy" / "envoy" / "envoy-peers.yaml"
FAST = ["--time-scale", "20"]
DEBUG = {"debug_header": True, "debug_match_counts": True}


def debug(reply) -> dict[str, str]:
    return dict(kv.split("=", 1) for kv in reply.headers.get("x-warmroute", "").split(";") if "=" in kv)


def opening(tag: str) -> list[dict]:
    """A conversation's first turn: no system prompt, so nothing but its own history is shared."""
    return [{"role": "user", "content": words(tag, 400)}]


def turn(port: int, messages: list[dict]):
    r = post(port, "/v1/chat/completions", chat(MODEL, messages, max_tokens=8))
    assert r.status == 200, r.body
    return r


def grown(messages: list[dict], reply, tag: str) -> list[dict]:
    """The conversation after `reply`, with the user's next question."""
    answer = reply.json()["choices"][0]["message"]["content"]
    return messages + [{"role": "assistant", "content": answer}, {"role": "user", "content": words(tag, 30)}]


def open_talks(envoy, n: int, tag: str) -> list[tuple[str, list[dict]]]:
    """`n` conversations' first turns through `envoy`: each one's pod and its next turn."""
    talks = []
    for i in range(n):
        messages = opening(f"{tag}{i}-")
        r = turn(envoy.port, messages)
        talks.append((r.replica, grown(messages, r, f"{tag}-next{i}-")))
    return talks


def imported(envoy) -> int:
    return envoy.stat("wasmcustom.warmroute.peers.events_imported")


def wait_imported(envoy, n: int) -> None:
    envoy.wait_for(f"{n} events imported from peers", lambda: imported(envoy) >= n,
                   detail=lambda: f"imported {imported(envoy)}, pulls failed "
                                  f"{envoy.stat('wasmcustom.warmroute.peers.pulls_failed')}")


def test_a_conversation_spread_over_the_replicas_finds_its_pod():
    with Fleet(3, FAST, gateways=3, config_file=PEERS, filter_overrides=DEBUG) as f:
        a, b, c = f.envoys
        talks = open_talks(a, 6, "spread")
        # Each other replica pulls a's 6 placements (its lease holder, within a tick or two).
        wait_imported(b, 6)
        wait_imported(c, 6)
        for i, (pod, messages) in enumerate(talks):
            r = turn(b.port, messages)
            d = debug(r)
            assert (r.replica, d["reason"]) == (pod, "cache_hit"), (i, d)
            held, blocks = map(int, d["match"].split("/"))
            assert held >= 6, (i, d)  # turn 1's ~2,000 words: 7 blocks of 256 bytes held, at least 6
            # The third turn, through the third replica, finds turns 1 and 2 (b's placement too).
            third = grown(messages, r, f"third{i}-")
            wait_imported(c, 6 + i + 1)
            r3 = turn(c.port, third)
            d3 = debug(r3)
            assert (r3.replica, d3["reason"]) == (pod, "cache_hit"), (i, d3)
            assert int(d3["match"].split("/")[0]) > held, (i, d, d3)
        # A client on the client port cannot read the events (only the peer port answers).
        c = http.client.HTTPConnection("127.0.0.1", a.port, timeout=10)
        c.request("GET", "/warmroute/peer/v1/events?since=0")
        assert c.getresponse().status == 404
        c.close()


def test_a_replica_started_mid_run_routes_its_first_turns_warm():
    f = Fleet(3, FAST, gateways=3, config_file=PEERS, filter_overrides=DEBUG)
    late = f.envoys[2]
    # Start the sims and two replicas; the third is down (its peers' pulls to it fail) until later.
    f.envoys = f.envoys[:2]
    with f:
        a = f.envoys[0]
        talks = open_talks(a, 5, "late")
        a.wait_for("a pull of the stopped replica failed", lambda: a.stat("wasmcustom.warmroute.peers.pulls_failed") >= 1)
        late.start(f.logdir)
        f.envoys.append(late)
        # Its first pulls copy a's recent events (the whole outbox on first contact).
        wait_imported(late, 5)
        for i, (pod, messages) in enumerate(talks):
            r = turn(late.port, messages)
            assert (r.replica, debug(r)["reason"]) == (pod, "cache_hit"), (i, debug(r))


def test_a_responses_conversation_spread_over_the_replicas_follows_its_stored_response():
    # vLLM keeps a stored response only on the pod that answered it: a follow-up through a
    # replica that did not proxy the answer must still reach that pod (any other answers 404).
    with Fleet(3, FAST + ["--enable-responses-store"], gateways=3, config_file=PEERS,
               filter_overrides=DEBUG) as f:
        previous, holder = None, None
        for turn_no in range(9):
            here = f.envoys[turn_no % 3]
            if previous:
                # This replica has the answers the two others proxied so far (each answer is
                # pulled by both of them), counted, not waited for with slack.
                others = sum(1 for k in range(turn_no) if k % 3 != turn_no % 3)
                here.wait_for(f"{others} stored responses' answers imported",
                              lambda: here.stat("wasmcustom.warmroute.peers.answers_imported") >= others)
            body = {"model": MODEL, "input": words(f"resp{turn_no}-", 60), "max_output_tokens": 8}
            if previous:
                body["previous_response_id"] = previous
            r = post(here.port, "/v1/responses", body)
            assert r.status == 200, (turn_no, r.body[:300])
            if turn_no == 0:
                holder = r.replica
            else:
                assert r.replica == holder, (turn_no, r.replica, holder)
                assert debug(r)["reason"] == "stored_response", (turn_no, debug(r))
            previous = r.json()["id"]
        # Each replica proxied 3 answers and imported the 6 others', each once.
        for e in f.envoys:
            e.wait_for("6 answers imported", lambda: e.stat("wasmcustom.warmroute.peers.answers_imported") >= 6)
            assert e.stat("wasmcustom.warmroute.peers.answers_imported") == 6


class Liar(http.server.BaseHTTPRequestHandler):
    """A peer that answers every pull with 200 and bytes that are not a batch."""

    def do_GET(self):  # noqa: N802 (the stdlib's name)
        body = b"wrpx\x01" + b"\xff" * 64
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_a_dead_peer_and_a_lying_one_change_nothing_for_clients():
    liar = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Liar)
    threading.Thread(target=liar.serve_forever, daemon=True).start()
    dead = free_port()
    try:
        f = Fleet(3, FAST, gateways=2, config_file=PEERS, filter_overrides=DEBUG)
        for e in f.envoys:
            e.peer_ports = e.peer_ports + [liar.server_address[1], dead]
        with f:
            a, b = f.envoys
            # Both bad peers are pulled and refused, every tick, while clients are served.
            b.wait_for("pulls of the dead and the lying peer failed",
                       lambda: b.stat("wasmcustom.warmroute.peers.pulls_failed") >= 4)
            talks = open_talks(a, 4, "liar")
            wait_imported(b, 4)
            for pod, messages in talks:
                r = turn(b.port, messages)
                assert (r.replica, debug(r)["reason"]) == (pod, "cache_hit"), debug(r)
            assert b.stat("wasmcustom.warmroute.peers.events_dropped") == 0
            assert b.stat("wasmcustom.warmroute.host_errors") == 0
    finally:
        liar.shutdown()
