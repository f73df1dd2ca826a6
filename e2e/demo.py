"""`make run`: the main job, end to end on 127.0.0.1.

Starts 3 simulated vLLM replicas and the real Envoy, replays the same agent
workload (shared system prompt, growing per-agent context) once through Envoy's
own round robin (no filter: what a plain Kubernetes Service gives) and once
through warmroute's cache_aware strategy, then prints where requests went and
the fleet's prefix-cache hit rate for both. Everything is stopped at the end.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from warmroute_harness import Fleet, run_loadgen

# A short run: 12 agents x 8 steps; the sims run 10x faster than a real H100, and one
# replica's KV cache (30k tokens) cannot hold every agent's context at once.
SIM_ARGS = ["--time-scale", "10", "--kv-capacity-tokens", "30000"]
WORKLOAD = ["agent", "--agents", "12", "--steps", "8", "--system-tokens", "1500", "--max-seconds", "90"]


def run(label: str, logdir: Path, **fleet_kwargs) -> dict:
    with Fleet(3, SIM_ARGS, logdir=logdir, **fleet_kwargs) as f:
        report = run_loadgen(WORKLOAD, [f"http://127.0.0.1:{f.envoy.port}"], [f"http://{s.address}" for s in f.sims],
                             logdir / f"{label}.json")
        report["decisions"] = {k.removeprefix("wasmcustom.warmroute.decision."): v
                               for k, v in f.envoy.stats().items()
                               if k.startswith("wasmcustom.warmroute.decision.") and v != "0"}
        return report


def show(label: str, r: dict) -> None:
    share = ", ".join(f"{k} {v * 100:.0f}%" for k, v in sorted(r.get("share", {}).items()))
    print(f"\n== {label}")
    print(f"  requests {r.get('requests')}  errors {r.get('errors')}  runtime {r.get('runtime_s', 0):.1f}s")
    print(f"  per backend: {share}")
    print(f"  fleet prefix-cache hit rate: {r.get('hit_rate', 0) * 100:.1f}%")
    t, s = r.get("ttft_ms", {}), r.get("step_ms", {})
    print(f"  TTFT ms mean {t.get('mean', 0):.0f}  p95 {t.get('p95', 0):.0f}   agent step ms mean {s.get('mean', 0):.0f}  p95 {s.get('p95', 0):.0f}")
    if r.get("decisions"):
        print(f"  warmroute decisions: {r['decisions']}")


def main() -> int:
    logdir = Path(tempfile.mkdtemp(prefix="warmroute-run-"))
    print(f"3 simulated vLLM replicas + Envoy 1.40 on 127.0.0.1 (logs: {logdir})")
    rr = run("envoy-round-robin", logdir, with_filter=False, lb="round_robin")
    show("Envoy round robin, no filter", rr)
    ca = run("warmroute-cache-aware", logdir, filter_overrides={"strategy": "cache_aware"})
    show("warmroute cache_aware (default)", ca)
    if rr.get("step_ms", {}).get("mean"):
        print(f"\ncache_aware vs round robin: hit rate {ca['hit_rate'] * 100:.1f}% vs {rr['hit_rate'] * 100:.1f}%, "
              f"mean step {ca['step_ms']['mean'] / rr['step_ms']['mean']:.2f}x, "
              f"p95 step {ca['step_ms']['p95'] / rr['step_ms']['p95']:.2f}x")
    return 0 if ca.get("errors", 1) == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
