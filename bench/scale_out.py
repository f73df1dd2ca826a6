"""Scaling out the gateway: 3 replicas against 1, with and without the exchange, in paired rounds.

    cd bench && flock /tmp/warmroute-heavy.lock ../.venv/bin/python scale_out.py --rounds 3

Per round and workload, three rows on fresh fleets in an order that rotates each round: one
gateway (`warmroute_cache_aware`), three gateways without the exchange (the same router), three
gateways that pull each other's placements (`warmroute_cache_aware_peers`, the load generator
spreading requests over them). A ratio is taken within its round (the machine's speed drifts
between rounds); the verdict is the median over rounds. Targets (issue #33): with the exchange,
3 gateways ≥ 0.97× one gateway's hit rate and ≤ 1.05× its TTFT P95 on every workload. Also
prints the exchange's cost: the replicas' Envoy CPU per request against one gateway's, and the
peers' pulls and imported events.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from quality import Bench

ROWS = [("1g", "warmroute_cache_aware", 1), ("3g", "warmroute_cache_aware", 3),
        ("3g+peers", "warmroute_cache_aware_peers", 3)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workloads", nargs="+", default=["agent", "chat", "conversation", "evicting"])
    ap.add_argument("--out", default="scale_out.jsonl")
    a = ap.parse_args()
    bench = Bench(quick=False, logdir=Path(tempfile.mkdtemp(prefix="warmroute-scale-out-")))
    rows: list[dict] = []
    with open(a.out, "w") as fh:
        for i in range(a.rounds):
            order = ROWS[i % len(ROWS):] + ROWS[:i % len(ROWS)]
            for w in a.workloads:
                for label, router, gateways in order:
                    row = bench.quality(w, router, gateways=gateways, label=f"{router}/{label}")
                    row = {**row, "round": i, "setup": label}
                    rows.append(row)
                    fh.write(json.dumps(row) + "\n")
                    fh.flush()
    print(f"\n{a.rounds} rounds; per workload: each setup's figure per round, then the median of its "
          "ratio to 1g within each round")
    for w in a.workloads:
        def of(setup: str) -> list[dict]:
            return sorted((r for r in rows if r["workload"] == w and r["setup"] == setup), key=lambda r: r["round"])

        one = of("1g")
        for setup in ("1g", "3g", "3g+peers"):
            mine = of(setup)
            hit = [r["hit_rate"] or 0 for r in mine]
            p95 = [(r["ttft_ms"] or {}).get("p95", 0) for r in mine]
            cpu = [r["envoy_cpu_s"] / max(r["ok"] or 1, 1) * 1e3 for r in mine]
            line = (f"  {w:12s} {setup:9s} hit {' '.join(f'{x:.3f}' for x in hit)}"
                    f"  ttft p95 {' '.join(f'{x:.0f}' for x in p95)}"
                    f"  envoy ms cpu/req {' '.join(f'{x:.2f}' for x in cpu)}")
            if setup != "1g":
                hr = statistics.median(m["hit_rate"] / o["hit_rate"] for m, o in zip(mine, one) if o["hit_rate"])
                tr = statistics.median(m["ttft_ms"]["p95"] / o["ttft_ms"]["p95"] for m, o in zip(mine, one))
                cr = statistics.median((m["envoy_cpu_s"] / max(m["ok"], 1)) / (o["envoy_cpu_s"] / max(o["ok"], 1))
                                       for m, o in zip(mine, one))
                line += f"  | median ratio to 1g: hit {hr:.3f}  ttft p95 {tr:.3f}  cpu/req {cr:.2f}"
            print(line)
        peers = [r.get("decisions", {}) for r in of("3g+peers")]
        print(f"  {w:12s} exchange: " + " | ".join(json.dumps({k: v for k, v in d.items() if k.startswith('peers')})
                                                 for d in peers))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
