"""Paired rounds of filter builds on the routing-quality rows: is a candidate better than the base?

    cd bench && flock /tmp/warmroute-bench.lock env PYTHONPATH=<checkout>/harness \
        ../.venv/bin/python pair.py --builds before.wasm after.wasm --rounds 3 \
        --workloads agent conversation --routers warmroute_cache_aware warmroute_prefix_hash

The machine's speed drifts by up to 2x over minutes, so a build is compared only with the
others run in the same round, in an order that rotates each round; the Envoy
baselines (`--baselines`, no filter) run once per round for the ratios the targets use.
Prints one line per run and, at the end, each row's figures per round; writes every row to
`--out` (JSON lines).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from quality import Bench
from scenarios import EXTRA_ROUTERS, ROUTERS

FIGURES = [("hit_rate",), ("ttft_ms", "mean"), ("ttft_ms", "p95"), ("e2e_ms", "mean"), ("e2e_ms", "p95"),
           ("step_ms", "mean"), ("step_ms", "p95")]


def figure(row: dict, path: tuple[str, ...]):
    v = row
    for k in path:
        v = (v or {}).get(k)
    return v


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--builds", nargs="+", required=True,
                    help="filter builds (.wasm), named A, B, C... in this order (A: the base)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--workloads", nargs="+", default=["agent", "conversation", "chat", "uniform"])
    ap.add_argument("--routers", nargs="+", default=["warmroute_cache_aware"])
    ap.add_argument("--baselines", nargs="*", default=["envoy_round_robin"],
                    help="rows without the filter, once per round (reference_1_replica_3x: the single replica)")
    ap.add_argument("--out", default="pair.jsonl")
    a = ap.parse_args()
    builds = {chr(ord("A") + i): Path(w).resolve() for i, w in enumerate(a.builds)}
    for name, wasm in builds.items():
        for r in a.routers:
            EXTRA_ROUTERS[f"{r}@{name}"] = {**ROUTERS[r], "wasm_file": wasm}
    bench = Bench(quick=False, logdir=Path(tempfile.mkdtemp(prefix="warmroute-pair-")))
    rows: list[dict] = []
    # Each row is written as it is measured: a run that dies late keeps its rounds.
    with open(a.out, "w") as fh:
        def keep(row: dict, i: int) -> None:
            rows.append({**row, "round": i})
            fh.write(json.dumps(rows[-1]) + "\n")
            fh.flush()

        for i in range(a.rounds):
            names = list(builds)
            order = names[i % len(names):] + names[:i % len(names)]
            for w in a.workloads:
                for base in a.baselines:
                    keep(bench.reference(w) if base == "reference_1_replica_3x" else bench.quality(w, base), i)
                for r in a.routers:
                    for name in order:
                        keep(bench.quality(w, f"{r}@{name}"), i)
    print("\nper row, per round: " + ", ".join(".".join(p) for p in FIGURES))
    for w in a.workloads:
        for r in a.baselines + [f"{r}@{n}" for r in a.routers for n in builds]:
            mine = [x for x in rows if x["workload"] == w and x["router"] == r]
            for p in FIGURES:
                vals = [figure(x, p) for x in mine]
                if any(v is not None for v in vals):
                    print(f"  {w:12s} {r:32s} {'.'.join(p):14s} "
                          + " ".join("-" if v is None else f"{v:9.3f}" for v in vals))
            print(f"  {w:12s} {r:32s} decisions      " + " | ".join(json.dumps(x["decisions"]) for x in mine))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
