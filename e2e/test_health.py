"""The companion tick through the real Envoy: load-aware shares, dead backends, one scraper per Envoy.

Time is counted in events, not seconds (this machine's ticks can be late): scrapes of a pod as
Envoy's metrics cluster counts them per host when they end, and the lease holder's ticks (one
scrape of every pod each); the filter's choice per request is its debug header. Waits have
generous timeouts as hang guards only: a timeout fails naming the event that never came."""

from __future__ import annotations

import collections
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from warmroute_harness import MODEL, Fleet, post, words

PERIOD_MS = 200
UNHEALTHY_AFTER = HEALTHY_AFTER = 2  # the shipped metrics.unhealthy_after / healthy_after


def chosen(reply) -> str | None:
    """The pod the filter chose (its debug header), whatever Envoy's retries then served."""
    fields = dict(kv.split("=", 1) for kv in reply.headers.get("x-warmroute", "").split(";") if "=" in kv)
    return fields.get("backend")


def failed_scrapes(f: Fleet, sim) -> int:
    return f.envoy.host_stats("pool-metrics").get(sim.port, {}).get("rq_error", 0)


def answered_scrapes(f: Fleet, sim) -> int:
    return f.envoy.host_stats("pool-metrics").get(sim.port, {}).get("rq_success", 0)


def metrics_overrides(**extra) -> dict:
    return {"metrics": {"period_ms": PERIOD_MS, "timeout_ms": 150, "stale_after_ms": 1000, **extra}}


def test_a_backend_with_a_long_queue_gets_a_smaller_share():
    # sim-0 admits one sequence at a time; flooding it directly (not through Envoy) builds a queue
    # that only its /metrics can reveal to the filter.
    with Fleet(3, ["--time-scale", "1"], filter_overrides={"strategy": "least_request", **metrics_overrides()}) as f:
        busy = f.sims[0]
        busy.stop()
        busy.args = ["--time-scale", "1", "--max-num-seqs", "1"]
        busy.start(f.logdir)
        stop = threading.Event()

        def flood():
            while not stop.is_set():
                try:
                    post(busy.port, "/v1/completions", {"model": MODEL, "prompt": "bg", "max_tokens": 20}, timeout=10)
                except OSError:
                    return

        floods = [threading.Thread(target=flood, daemon=True) for _ in range(8)]
        for t in floods:
            t.start()
        f.envoy.wait_for("a queue of 5 on sim-0", lambda: busy.metrics().get("vllm:num_requests_waiting", 0) >= 5)
        f.envoy.wait_scraped(busy)  # a scrape shows the queue to every VM
        counts = collections.Counter(
            post(f.envoy.port, "/v1/completions", {"model": MODEL, "prompt": f"fg {i}", "max_tokens": 1}).replica
            for i in range(30))
        stop.set()
        for t in floods:
            t.join(15)
        assert counts[busy.name] < min(counts[s.name] for s in f.sims[1:]), counts


def test_a_killed_backend_leaves_rotation_and_rejoins():
    with Fleet(3, ["--time-scale", "20"],
               filter_overrides={"strategy": "round_robin", "debug_header": True, **metrics_overrides()}) as f:
        victim = f.sims[1]
        e = f.envoy
        failed = failed_scrapes(f, victim)
        victim.stop()
        # Requests keep flowing while the tick notices; Envoy's retry to the next endpoint covers
        # the gap. Out of rotation within UNHEALTHY_AFTER failed scrapes of it, seen by every VM
        # within 2 more ticks of the holder.
        def noticed() -> bool:
            post(e.port, "/v1/completions", {"model": MODEL, "prompt": "k", "max_tokens": 1})
            return failed_scrapes(f, victim) >= failed + UNHEALTHY_AFTER
        e.wait_for(f"{UNHEALTHY_AFTER} failed scrapes of the killed pod", noticed)
        e.wait_ticks(2)
        assert healthy_gauge(f, victim) == "0"
        after = [post(e.port, "/v1/completions", {"model": MODEL, "prompt": f"a{i}", "max_tokens": 1}) for i in range(30)]
        assert all(r.status == 200 for r in after), [r.status for r in after]
        assert victim.name not in {r.replica for r in after}
        # The filter itself stops choosing it (not only Envoy's retry saving the request).
        assert victim.name not in {chosen(r) for r in after}, [chosen(r) for r in after]
        answered = answered_scrapes(f, victim)
        victim.start(f.logdir)
        # Back after healthy_after good scrapes (all of them after the restart), seen by every VM
        # within 2 more ticks of the holder.
        e.wait_for(f"{HEALTHY_AFTER} answered scrapes of the restarted pod",
                   lambda: answered_scrapes(f, victim) >= answered + HEALTHY_AFTER)
        e.wait_ticks(2)
        back = collections.Counter(
            post(e.port, "/v1/completions", {"model": MODEL, "prompt": f"c{i}", "max_tokens": 1}).replica
            for i in range(9))
        assert back[victim.name] == 3, back


def healthy_gauge(f: Fleet, sim) -> str | None:
    return f.envoy.stats().get(f"wasmcustom.warmroute.backend.{sim.name}.healthy")


def test_a_backend_that_is_not_a_cluster_endpoint_is_marked_down():
    # The filter lists sim-2, which serves /metrics, but Envoy's pool does not know it: a
    # scrape through override_host would fall back to another pod, whose health would
    # then stand for sim-2's. The metrics cluster must fail that scrape instead.
    fleet = Fleet(3, ["--time-scale", "20"], filter_overrides={"strategy": "round_robin", **metrics_overrides()})
    fleet.envoy.endpoints = fleet.sims[:2]
    with fleet as f:
        stray = f.sims[2]
        e = f.envoy
        # Scrapes of sim-2 fail in Envoy (no host to pick: `upstream_cx_none_healthy`), counted
        # as they end. It is down within UNHEALTHY_AFTER of them, once every VM has read the
        # verdict: the gauge is read in the same snapshot as the count, and the VMs' ticks that
        # publish the verdict come with at most 2 more of the holder's scrapes of it.
        def down() -> dict[str, str] | None:
            st = e.stats()
            fresh = all(st.get(f"wasmcustom.warmroute.backend.{s.name}.healthy") == "1" for s in f.sims[:2])
            return st if fresh and st.get(f"wasmcustom.warmroute.backend.{stray.name}.healthy") == "0" else None
        st = e.wait_for("sim-2 marked down (and the others up)", down)
        failures = e.stat("cluster.pool-metrics.upstream_cx_none_healthy", st)
        assert UNHEALTHY_AFTER <= failures <= UNHEALTHY_AFTER + 2, failures
        # Each scraped pod answered for itself only: nothing reached sim-2.
        assert stray.metrics().get("vllm:request_success_total", 0) == 0
        replies = [post(e.port, "/v1/completions", {"model": MODEL, "prompt": f"s{i}", "max_tokens": 1})
                   for i in range(12)]
        assert all(r.status == 200 for r in replies)
        assert {r.replica for r in replies} == {"sim-0", "sim-1"}


def test_a_slow_metrics_endpoint_does_not_eject_a_pod_that_serves():
    # The shipped scrape settings (period 500 ms, timeout 400 ms). Under load sim-1's
    # /metrics starts taking 450 ms (it is restarted with that delay): every scrape of it
    # times out while it keeps answering requests.
    with Fleet(3, ["--time-scale", "20"], filter_overrides={"strategy": "round_robin"}) as f:
        slow = f.sims[1]
        e = f.envoy
        stop = threading.Event()
        served = collections.Counter()

        def client(i):
            n = 0
            while not stop.is_set():
                r = post(e.port, "/v1/completions", {"model": MODEL, "prompt": f"t{i} {n}", "max_tokens": 1})
                served[(r.status, r.replica)] += 1
                n += 1

        with ThreadPoolExecutor(4) as ex:
            for i in range(4):
                ex.submit(client, i)
            e.wait_for("30 requests served", lambda: sum(served.values()) >= 30)
            slow.stop()
            slow.args += ["--metrics-delay-ms", "450"]
            slow.start(f.logdir)
            # Counted in the holder's ticks (scrapes of the fast pods), not seconds: 2 for the
            # scrapes of the restarted pod to start timing out, then 8 whose gauge each VM
            # writes at its tick from what the holder shared.
            e.wait_ticks(2)
            gauges, before = [], served[(200, slow.name)]
            for _ in range(8):
                e.wait_ticks(1)
                gauges.append(healthy_gauge(f, slow))
            stop.set()
        stats = e.settled_stats()
        assert int(stats["wasmcustom.warmroute.scrape.slow"]) >= 6, "the delay did not make scrapes time out"
        assert gauges.count("0") == 0, gauges
        assert served[(200, slow.name)] - before > 0, served
        # Only the requests in flight on sim-1 at its restart may have failed.
        assert sum(n for (status, _), n in served.items() if status != 200) <= 4, served


def test_a_down_verdict_expires_once_scraping_stops():
    # sim-1 is dead long enough to be marked down; the operator turns scraping off and the
    # pod comes back: no scrape will ever clear the verdict, which must expire on its own.
    # When exactly (stale_after_ms after the last failed scrape, in host time) is unit-tested
    # (health::a_down_verdict_nobody_renews_expires); here, through Envoy, that it expires at
    # all, not before stale_after_ms, and with no scrape: there is no tick to count once
    # scraping is off, so only the lower bound is in seconds (a late machine can only delay
    # the return), and the upper one is a hang guard.
    stale_ms = 1500
    fleet = Fleet(3, ["--time-scale", "20"], dynamic_listener=True,
                  filter_overrides={"strategy": "round_robin", **metrics_overrides(stale_after_ms=stale_ms)})
    with fleet as f:
        victim = f.sims[1]
        e = f.envoy
        victim.stop()
        e.wait_for("sim-1 marked down", lambda: healthy_gauge(f, victim) == "0")
        # When each failed scrape of it ended, to within a poll: the verdict is renewed by each.
        samples: list[tuple[float, int]] = []
        sampling = threading.Event()

        def sample():
            while not sampling.is_set():
                samples.append((time.time(), failed_scrapes(f, victim)))
                time.sleep(0.01)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        # Scraping stops first: a scrape of the restarted pod would clear the verdict. The old
        # listener's VMs (which scrape) are gone when this returns.
        e.reconfigure({"metrics": {"enabled": False}})
        sampling.set()
        sampler.join(5)
        last = failed_scrapes(f, victim)
        # The last failed scrape ended after the last sample that had not counted it yet.
        renewed = max((t for t, n in samples if n < last), default=None)
        assert renewed is not None, "no scrape of sim-1 failed while the old listener drained"
        scrapes = e.stat("cluster.pool-metrics.upstream_rq_completed")
        victim.start(f.logdir)
        back: list[float] = []

        def returned() -> bool:
            start = time.time()
            r = post(e.port, "/v1/completions", {"model": MODEL, "prompt": "e", "max_tokens": 1})
            assert r.status == 200
            if r.replica == victim.name:
                back.append(start)
            return bool(back)
        e.wait_for("the pod's traffic back", returned, timeout=10 * stale_ms / 1000)
        assert back[0] >= renewed + stale_ms / 1000, (back[0] - renewed, "back before the verdict expired")
        assert e.stat("cluster.pool-metrics.upstream_rq_completed") == scrapes, "a scrape ran after scraping stopped"


def test_one_scrape_per_backend_per_period_with_four_workers():
    # Five VMs (main + 4 workers) scraping would scrape every pod ~5 times a period. Counted:
    # a window of WINDOW scrapes of the most scraped pod, whose wall-clock length bounds the
    # ticks in it from above (Envoy re-arms a VM's tick timer a period after it ran, so a
    # late machine only makes the window longer, never holds more ticks).
    window = 15
    with Fleet(3, ["--time-scale", "20"], concurrency=4, filter_overrides=metrics_overrides()) as f:
        e = f.envoy
        e.wait_ticks(2)
        start = {s.name: e.scrapes(s) for s in f.sims}
        t0 = time.time()
        e.wait_ticks(window)
        elapsed = time.time() - t0
        scrapes = {s.name: e.scrapes(s) - start[s.name] for s in f.sims}
        # One scrape per pod per tick of one VM, every pod each tick; a late lease renewal that
        # hands the lease over may add one.
        periods = elapsed * 1000 / PERIOD_MS
        assert all(n <= periods + 2 for n in scrapes.values()), (scrapes, periods)
        assert all(n >= window - 1 for n in scrapes.values()), scrapes


def test_without_metrics_the_filter_still_routes_on_its_own_accounting():
    # 24 distinct prompts from 4 clients, placed by rendezvous on their hash (~uniform): some
    # pod gets none with probability at most 3 (2/3)^24 = 2e-4.
    with Fleet(3, ["--time-scale", "20"], filter_overrides={"metrics": {"enabled": False}}) as f:
        def one(i):
            return post(f.envoy.port, "/v1/chat/completions",
                        {"model": MODEL, "max_tokens": 2,
                         "messages": [{"role": "user", "content": words(f"solo{i}_", 200)}]})
        with ThreadPoolExecutor(4) as ex:
            replies = list(ex.map(one, range(24)))
        assert all(r.status == 200 for r in replies)
        assert len({r.replica for r in replies}) == 3
        # No scrape: Envoy's metrics cluster never got a request. With scraping off there is no
        # tick to count, so this waits two periods (a late machine only makes it less sensitive).
        assert f.envoy.stat("cluster.pool-metrics.upstream_rq_total", f.envoy.settled_stats()) == 0
