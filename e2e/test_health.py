"""The companion tick through the real Envoy: load-aware shares, dead backends, one scraper per Envoy."""

from __future__ import annotations

import collections
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from warmroute_harness import MODEL, Fleet, post, words

PERIOD_MS = 200


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
        deadline = time.time() + 10
        while busy.metrics().get("vllm:num_requests_waiting", 0) < 5 and time.time() < deadline:
            time.sleep(0.05)
        time.sleep(3 * PERIOD_MS / 1000)
        counts = collections.Counter(
            post(f.envoy.port, "/v1/completions", {"model": MODEL, "prompt": f"fg {i}", "max_tokens": 1}).replica
            for i in range(30))
        stop.set()
        for t in floods:
            t.join(15)
        assert counts[busy.name] < min(counts[s.name] for s in f.sims[1:]), counts


def test_a_killed_backend_leaves_rotation_and_rejoins():
    with Fleet(3, ["--time-scale", "20"], filter_overrides={"strategy": "round_robin", **metrics_overrides()}) as f:
        victim = f.sims[1]
        victim.stop()
        killed_at = time.time()
        # Requests keep flowing while the tick notices; Envoy's retry to the next endpoint covers the gap.
        results = []
        while time.time() - killed_at < 2 * 2 * PERIOD_MS / 1000 + 0.3:
            r = post(f.envoy.port, "/v1/completions", {"model": MODEL, "prompt": "k", "max_tokens": 1})
            results.append((time.time() - killed_at, r))
        after = [post(f.envoy.port, "/v1/completions", {"model": MODEL, "prompt": f"a{i}", "max_tokens": 1}) for i in range(30)]
        assert all(r.status == 200 for r in after), [r.status for r in after]
        assert victim.name not in {r.replica for r in after}
        # Within two tick periods after the failure threshold, the filter itself stops choosing it.
        stats = f.envoy.stats()
        assert stats.get(f"wasmcustom.warmroute.backend.{victim.name}.healthy") == "0"
        chosen_before = f.envoy.counter(f"warmroute.backend.{victim.name}.chosen")
        for i in range(9):
            post(f.envoy.port, "/v1/completions", {"model": MODEL, "prompt": f"b{i}", "max_tokens": 1})
        assert f.envoy.counter(f"warmroute.backend.{victim.name}.chosen") == chosen_before
        victim.start(f.logdir)
        # Back after healthy_after (2) good scrapes, seen by every VM one tick later.
        time.sleep(4 * PERIOD_MS / 1000)
        back = collections.Counter(
            post(f.envoy.port, "/v1/completions", {"model": MODEL, "prompt": f"c{i}", "max_tokens": 1}).replica
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
        deadline = time.time() + 10
        while healthy_gauge(f, stray) != "0" and time.time() < deadline:
            time.sleep(PERIOD_MS / 4000)
        assert healthy_gauge(f, stray) == "0"
        # Counted in scrapes, not seconds (this machine's ticks can be late): at most
        # 3 periods' worth, and each scraped pod answered for itself only.
        stats = f.envoy.settled_stats()
        assert int(stats["wasmcustom.warmroute.scrape.failed"]) <= 3 + 2, stats["wasmcustom.warmroute.scrape.failed"]
        assert stray.metrics().get("vllm:request_success_total", 0) == 0
        replies = [post(f.envoy.port, "/v1/completions", {"model": MODEL, "prompt": f"s{i}", "max_tokens": 1})
                   for i in range(12)]
        assert all(r.status == 200 for r in replies)
        assert {r.replica for r in replies} == {"sim-0", "sim-1"}


def test_a_slow_metrics_endpoint_does_not_eject_a_pod_that_serves():
    # The shipped scrape settings (period 500 ms, timeout 400 ms). Under load sim-1's
    # /metrics starts taking 450 ms (it is restarted with that delay): every scrape of it
    # times out while it keeps answering requests.
    with Fleet(3, ["--time-scale", "20"], filter_overrides={"strategy": "round_robin"}) as f:
        slow = f.sims[1]
        stop = threading.Event()
        served = collections.Counter()

        def client(i):
            n = 0
            while not stop.is_set():
                r = post(f.envoy.port, "/v1/completions", {"model": MODEL, "prompt": f"t{i} {n}", "max_tokens": 1})
                served[(r.status, r.replica)] += 1
                n += 1

        with ThreadPoolExecutor(4) as ex:
            for i in range(4):
                ex.submit(client, i)
            time.sleep(1.0)
            slow.stop()
            slow.args += ["--metrics-delay-ms", "450"]
            slow.start(f.logdir)
            time.sleep(1.0)
            gauges, before = [], served[(200, slow.name)]
            for _ in range(16):  # 4 s: 8 scrape periods
                time.sleep(0.25)
                gauges.append(healthy_gauge(f, slow))
            stop.set()
        stats = f.envoy.settled_stats()
        assert int(stats["wasmcustom.warmroute.scrape.slow"]) >= 6, "the delay did not make scrapes time out"
        assert gauges.count("0") == 0, gauges
        assert served[(200, slow.name)] - before > 0, served
        # Only the requests in flight on sim-1 at its restart may have failed.
        assert sum(n for (status, _), n in served.items() if status != 200) <= 4, served


def test_a_down_verdict_expires_once_scraping_stops():
    # sim-1 is dead long enough to be marked down; the operator turns scraping off and the
    # pod comes back: no scrape will ever clear the verdict, which must expire on its own.
    stale_ms = 1500
    fleet = Fleet(3, ["--time-scale", "20"], dynamic_listener=True,
                  filter_overrides={"strategy": "round_robin", **metrics_overrides(stale_after_ms=stale_ms)})
    with fleet as f:
        victim = f.sims[1]
        victim.stop()
        deadline = time.time() + 10
        while healthy_gauge(f, victim) != "0" and time.time() < deadline:
            time.sleep(PERIOD_MS / 4000)
        assert healthy_gauge(f, victim) == "0"
        # Scraping stops first: a scrape of the restarted pod would clear the verdict.
        f.envoy.reconfigure({"metrics": {"enabled": False}})
        changed = time.time()
        victim.start(f.logdir)
        replicas = []
        while time.time() - changed < 4 * stale_ms / 1000:
            r = post(f.envoy.port, "/v1/completions", {"model": MODEL, "prompt": "e", "max_tokens": 1})
            assert r.status == 200
            replicas.append((time.time() - changed, r.replica))
            time.sleep(0.02)
        first = min((t for t, name in replicas if name == victim.name), default=None)
        assert first is not None, "the pod never got traffic back"
        # The verdict is at most stale_after_ms old when scraping stops; the new VM's first
        # tick (one period) re-reads it.
        assert first <= (stale_ms + 2 * PERIOD_MS) / 1000 + 0.5, first
        assert f.envoy.counter("warmroute.scrape.ok") > 0


def test_one_scrape_per_backend_per_period_with_four_workers():
    with Fleet(3, ["--time-scale", "20"], concurrency=4, filter_overrides=metrics_overrides()) as f:
        time.sleep(1.0)
        start = f.envoy.counter("warmroute.scrape.ok")
        window = 3.0
        time.sleep(window)
        scrapes = f.envoy.counter("warmroute.scrape.ok") - start
        expected = window * 1000 / PERIOD_MS * len(f.sims)
        # Five VMs (main + 4 workers) scraping would give ~5x.
        assert 0.6 * expected <= scrapes <= 1.3 * expected, (scrapes, expected)


def test_without_metrics_the_filter_still_routes_on_its_own_accounting():
    with Fleet(3, ["--time-scale", "20"], filter_overrides={"metrics": {"enabled": False}}) as f:
        def one(i):
            return post(f.envoy.port, "/v1/chat/completions",
                        {"model": MODEL, "max_tokens": 2,
                         "messages": [{"role": "user", "content": words(f"solo{i}_", 200)}]})
        with ThreadPoolExecutor(4) as ex:
            replies = list(ex.map(one, range(24)))
        assert all(r.status == 200 for r in replies)
        assert len({r.replica for r in replies}) == 3
        assert f.envoy.counter("warmroute.scrape.ok") == 0
