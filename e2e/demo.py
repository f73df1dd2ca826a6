"""`make run`: the main job, end to end on 127.0.0.1.

Starts simulated vLLM replicas and the real Envoy, replays the same agent workload (the
bench's `agent` scenario: a 6k-token shared system prompt, contexts growing to 40-70k tokens
over 12 tool steps, 12 agents) once through Envoy's own round robin (no filter: what a plain
Kubernetes Service gives) and once through warmroute's cache_aware strategy, then prints
where requests went, the fleet's prefix-cache hit rate and the agents' step times for both.

Both runs use `deploy/envoy/envoy-pool.yaml`: the pods come from Envoy's endpoint discovery (a
watched file here), not from a list in the filter's configuration. After the warmroute run a
fourth pod joins the pool, and new conversations reach it within a tick or two, while the
agents keep their warm pods. Everything is stopped at the end.
"""

from __future__ import annotations

import collections
import sys
import tempfile
import time
from pathlib import Path

from warmroute_harness import MODEL, ROOT, Fleet, post, run_loadgen, words

sys.path.insert(0, str(ROOT / "bench"))
from scenarios import TIME_SCALE, WORKLOADS, sim_args  # noqa: E402  (the bench's own scenario)

AGENT = WORKLOADS["agent"]
POOL_CONFIG = ROOT / "deploy" / "envoy" / "envoy-pool.yaml"


def run(label: str, logdir: Path, join: bool = False, **envoy_kwargs) -> dict:
    """The agent workload over 3 pods; with `join`, a 4th pod then joins the pool and new
    conversations are sent."""
    fleet = Fleet(4, sim_args(AGENT["capacity"]), logdir=logdir, config_file=POOL_CONFIG, **envoy_kwargs)
    fleet.envoy.endpoints = fleet.sims[:3]
    with fleet as f:
        # The filter learns the pool at its first tick; the run starts once it has.
        time.sleep(2 * f.envoy.tick_s)
        report = run_loadgen(AGENT["args"], [f"http://127.0.0.1:{f.envoy.port}"],
                             [f"http://{s.address}" for s in f.sims[:3]], logdir / f"{label}.json")
        report["decisions"] = {k.removeprefix("wasmcustom.warmroute.decision."): v
                               for k, v in f.envoy.settled_stats().items()
                               if k.startswith("wasmcustom.warmroute.decision.") and v != "0"}
        if join:
            f.envoy.set_endpoints(f.sims)
            time.sleep(2 * f.envoy.tick_s)
            report["after_join"] = collections.Counter(
                post(f.envoy.port, "/v1/chat/completions",
                     {"model": MODEL, "max_tokens": 8,
                      "messages": [{"role": "user", "content": words(f"new{i}_", 300)}]}).replica
                for i in range(24))
        return report


def show(label: str, r: dict) -> None:
    share = ", ".join(f"{k} {v * 100:.0f}%" for k, v in sorted(r.get("share", {}).items()))
    print(f"\n== {label}")
    print(f"  requests {r.get('requests')}  errors {r.get('errors')}  runtime {r.get('runtime_s', 0):.1f}s")
    print(f"  per pod: {share}")
    print(f"  fleet prefix-cache hit rate: {r.get('hit_rate', 0) * 100:.1f}%")
    t, s = r.get("ttft_ms", {}), r.get("step_ms", {})
    print(f"  TTFT ms mean {t.get('mean', 0):.0f}  p95 {t.get('p95', 0):.0f}   "
          f"agent step ms mean {s.get('mean', 0):.0f}  p95 {s.get('p95', 0):.0f}")
    if r.get("decisions"):
        print(f"  warmroute decisions: {r['decisions']}")
    if r.get("after_join"):
        spread = ", ".join(f"{k} {v}" for k, v in sorted(r["after_join"].items()))
        print(f"  then sim-3 joined the pool (EDS); 24 new conversations went: {spread}")


def main() -> int:
    logdir = Path(tempfile.mkdtemp(prefix="warmroute-run-"))
    print(f"Simulated vLLM replicas (running {TIME_SCALE:.0f}x faster than an H100-class GPU, "
          f"{AGENT['capacity'] // 1000}k tokens of KV each) + Envoy 1.40 on 127.0.0.1 (logs: {logdir})")
    print(f"Workload: {AGENT['why']}")
    rr = run("envoy-round-robin", logdir, with_filter=False, lb="round_robin")
    show("Envoy round robin, no filter", rr)
    ca = run("warmroute-cache-aware", logdir, join=True, filter_overrides={"strategy": "cache_aware"})
    show("warmroute cache_aware (default)", ca)
    if rr.get("step_ms", {}).get("mean"):
        print(f"\ncache_aware vs round robin: hit rate {ca['hit_rate'] * 100:.1f}% vs {rr['hit_rate'] * 100:.1f}%, "
              f"mean step {ca['step_ms']['mean'] / rr['step_ms']['mean']:.2f}x, "
              f"p95 step {ca['step_ms']['p95'] / rr['step_ms']['p95']:.2f}x")
    return 0 if ca.get("errors", 1) == 0 and rr.get("errors", 1) == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
