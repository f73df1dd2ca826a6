"""A pool whose pods Envoy discovers (deploy/envoy/envoy-pool.yaml, EDS from a watched file): the
filter follows pods that join and leave while traffic flows, with no list of addresses.

Time is counted in events, not seconds (this machine's ticks can be late): Envoy's own view of
the pool (`cluster.pool.membership_total`) says when it applied a change, and the lease
holder's reads of the pool (one per tick, `cluster.envoy-admin.upstream_rq_completed`) are the
filter's clock. The filter's choice per request is its debug header, read as each reply arrives,
so nothing waits for the tick that flushes its counters."""

from __future__ import annotations

import threading

from warmroute_harness import MODEL, ROOT, Fleet, post

PERIOD_MS = 200
POOL_CONFIG = ROOT / "deploy" / "envoy" / "envoy-pool.yaml"
# Reads of the pool after Envoy applied a change by which every VM routes over the new list:
# the read in flight at that moment may predate it (1), the next one sees it and publishes the
# slot table (2), and every VM applies the table at its own next tick, one period later (3);
# one more for a VM whose tick comes just after the holder's.
APPLIED_WITHIN = 4
# Requests per phase, all started once the phase's change is applied. Unique prompts are placed
# by rendezvous on their hash, ~uniform over the pods: a given pod of 4 gets none of them with
# probability (3/4)^40 = 1e-5, some pod of 3 none with at most 3 (2/3)^40 = 3e-7; the test's
# three such draws fail a correct filter with probability < 2e-5.
SAMPLE = 40


def backend(reply) -> str | None:
    fields = dict(kv.split("=", 1) for kv in reply.headers.get("x-warmroute", "").split(";") if "=" in kv)
    return fields.get("backend")


def test_pods_that_join_and_leave_are_followed_without_a_failed_request():
    fleet = Fleet(4, ["--time-scale", "20"], config_file=POOL_CONFIG,
                  filter_overrides={"metrics": {"period_ms": PERIOD_MS, "timeout_ms": 150}, "debug_header": True})
    fleet.envoy.endpoints = fleet.sims[:3]
    with fleet as f:
        e = f.envoy
        stop = threading.Event()
        # Requests are labelled with the phase at their start: 1 the first three pods, 2 sim-3
        # joined, 3 sim-1 left (still running), each once applied; 0 on the way to one, and 0 for
        # a request still under way when the endpoints changed (a client thread the machine
        # held back could send it after the change).
        phase, changes = 0, 0
        log: list[tuple[int, int, str | None, str | None]] = []  # (phase at its start, status, replica, choice)

        def client(i: int) -> None:
            n = 0
            while not stop.is_set():
                c = changes  # before the phase, which a change sets to 0 first
                p = phase
                r = post(e.port, "/v1/completions", {"model": MODEL, "prompt": f"client {i} request {n}", "max_tokens": 1})
                log.append((p if c == changes else 0, r.status, r.replica, backend(r)))
                n += 1

        def next_phase(what: str, pods: list) -> None:
            nonlocal phase, changes
            labelled, phase = phase + 1, 0
            changes += 1
            e.set_endpoints(pods)
            e.wait_for(f"Envoy's pool at {len(pods)} pods ({what})",
                       lambda: e.stat("cluster.pool.membership_total") == len(pods))
            e.wait_ticks(APPLIED_WITHIN)
            phase = labelled
            e.wait_for(f"{SAMPLE} requests after {what}", lambda: sum(1 for x in log if x[0] == phase) >= SAMPLE)

        clients = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(4)]
        for t in clients:
            t.start()
        try:
            next_phase("the first reads", f.sims[:3])
            next_phase("sim-3 joined", f.sims)
            next_phase("sim-1 left", [f.sims[0], f.sims[2], f.sims[3]])
        finally:
            stop.set()
            for t in clients:
                t.join(10)

    assert all(status == 200 for _, status, _, _ in log), [r for r in log if r[1] != 200][:5]
    served = {p: {replica for q, _, replica, _ in log if q == p} for p in (1, 2, 3)}
    assert served[1] == {"sim-0", "sim-1", "sim-2"}, served
    # Within APPLIED_WITHIN reads of Envoy's update the new pod takes traffic, and after as many
    # once it left, the departed pod gets none; it was never killed, so nothing failed.
    assert served[2] == {"sim-0", "sim-1", "sim-2", "sim-3"}, served
    assert served[3] == {"sim-0", "sim-2", "sim-3"}, served
    # The filter, not Envoy's fallback policy, routed them (Envoy's round robin would also have
    # followed the endpoints): it chose a pod for every request once it had read the pool, each
    # slot stands for one pod, and the new pod took the first free slot.
    chosen = [(p, replica, choice) for p, _, replica, choice in log if p >= 1]
    assert all(choice for _, _, choice in chosen), [c for c in chosen if not c[2]][:5]
    slots = {choice: {replica for _, replica, c in chosen if c == choice} for _, _, choice in chosen}
    assert all(len(r) == 1 for r in slots.values()), slots
    assert slots.get("pod-3") == {"sim-3"}, slots
    departed = next(c for c, r in slots.items() if r == {"sim-1"})
    assert not [x for x in chosen if x[0] == 3 and x[2] == departed], "the filter still chose the departed pod"
