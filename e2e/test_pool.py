"""A pool whose pods Envoy discovers (envoy/envoy-pool.yaml, EDS from a watched file): the
filter follows pods that join and leave while traffic flows, with no list of addresses."""

from __future__ import annotations

import threading
import time

from warmroute_harness import MODEL, ROOT, Fleet, post

PERIOD_MS = 200
POOL_CONFIG = ROOT / "envoy" / "envoy-pool.yaml"


def test_pods_that_join_and_leave_are_followed_without_a_failed_request():
    fleet = Fleet(4, ["--time-scale", "20"], config_file=POOL_CONFIG,
                  filter_overrides={"metrics": {"period_ms": PERIOD_MS, "timeout_ms": 150}})
    fleet.envoy.endpoints = fleet.sims[:3]
    with fleet as f:
        stop = threading.Event()
        log: list[tuple[float, float, int, str | None]] = []

        def client(i: int) -> None:
            n = 0
            while not stop.is_set():
                start = time.time()
                r = post(f.envoy.port, "/v1/completions",
                         {"model": MODEL, "prompt": f"client {i} request {n}", "max_tokens": 1})
                log.append((start, time.time(), r.status, r.replica))
                n += 1

        clients = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(4)]
        for t in clients:
            t.start()
        try:
            time.sleep(1.0)
            joined_at = time.time()
            f.envoy.set_endpoints(f.sims)  # sim-3 appears
            time.sleep(1.5)
            left_at = time.time()
            f.envoy.set_endpoints([f.sims[0], f.sims[2], f.sims[3]])  # sim-1 leaves (still running)
            time.sleep(1.5)
        finally:
            stop.set()
            for t in clients:
                t.join(10)
        tick = PERIOD_MS / 1000
        assert all(status == 200 for _, _, status, _ in log), [r for r in log if r[2] != 200][:5]
        before = {replica for start, _, _, replica in log if start < joined_at}
        assert before == {"sim-0", "sim-1", "sim-2"}, before
        first_new = min((start for start, _, _, replica in log if replica == "sim-3"), default=None)
        assert first_new is not None, "the new pod never got traffic"
        # Within 2 ticks of appearing (the lease holder's read, then every VM's own tick),
        # plus what this machine's scheduling adds.
        assert first_new - joined_at <= 2 * tick + 0.5, first_new - joined_at
        # None after 1 tick (+ scheduling) once it left; it was never killed, so nothing failed.
        late = [start - left_at for start, _, _, replica in log
                if replica == "sim-1" and start > left_at + tick + 0.5]
        assert late == [], late
        after = {replica for start, _, _, replica in log if start > left_at + tick + 0.5}
        assert after == {"sim-0", "sim-2", "sim-3"}, after
        # The filter, not Envoy's fallback policy, routed them: it chose a pod for every
        # request after the first read of the pool (Envoy's round robin would also have
        # followed the endpoints).
        stats = f.envoy.settled_stats()
        chosen = sum(int(v) for k, v in stats.items()
                     if k.startswith("wasmcustom.warmroute.backend.pod-") and k.endswith(".chosen"))
        assert chosen >= sum(1 for start, _, _, _ in log if start >= joined_at), (chosen, len(log))
        assert int(stats["wasmcustom.warmroute.backend.pod-3.chosen"]) > 0
