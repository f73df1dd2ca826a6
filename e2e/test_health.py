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
        time.sleep(3 * PERIOD_MS / 1000)
        back = collections.Counter(
            post(f.envoy.port, "/v1/completions", {"model": MODEL, "prompt": f"c{i}", "max_tokens": 1}).replica
            for i in range(9))
        assert back[victim.name] == 3, back


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
