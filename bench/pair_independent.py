"""Paired rounds of filter builds on the independent client's shapes (guidellm, `independent.py`):
is a candidate's `cache_aware` as good as the base's on the hot-prefix and 40-prefix shapes?

    cd bench && flock /tmp/warmroute-bench.lock env PYTHONPATH=<checkout>/harness \
        ../.venv/bin/python pair_independent.py --builds base.wasm cand.wasm --rounds 3

`pair.py` does this for the project's own load client; these shapes need guidellm (installed
by `make .venv/.bench-installed`) and run at time scale 1, each on a fresh fleet. Each round
runs Envoy round robin once per shape (the targets' ratios) and every build, in an order that
rotates each round: the machine's speed drifts over minutes, so a build is compared only with
the runs of its own round. Prints one line per run and, at the end, each shape's figures per
round as ratios to that round's round robin; writes every row to `--out` (JSON lines).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import independent
from pair import figure

FIGURES = [("hit_rate",), ("ttft_ms", "mean"), ("ttft_ms", "p95"), ("ttft_ms", "p99")]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--builds", nargs="+", required=True,
                    help="filter builds (.wasm), named A, B, C... in this order (A: the base)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--shapes", nargs="+", default=list(independent.SHAPES), choices=list(independent.SHAPES))
    ap.add_argument("--out", default="pair_independent.jsonl")
    a = ap.parse_args()
    builds = {chr(ord("A") + i): Path(w).resolve() for i, w in enumerate(a.builds)}
    for name, wasm in builds.items():
        independent.ROUTER_KWARGS[f"cache_aware@{name}"] = {
            **independent.ROUTER_KWARGS["warmroute_cache_aware"], "wasm_file": wasm}
    logdir = Path(tempfile.mkdtemp(prefix="warmroute-pair-independent-"))
    tokenizer = independent.word_tokenizer(logdir / "word-tokenizer")
    rows: list[dict] = []
    with open(a.out, "w") as fh:
        for i in range(a.rounds):
            names = ["envoy_round_robin"] + [f"cache_aware@{n}" for n in builds]
            # Round robin first, then the builds rotated, then the whole order reversed every
            # other round: no build always follows the same run.
            order = names[:1] + names[1:][i % len(builds):] + names[1:][:i % len(builds)]
            if i % 2:
                order = order[::-1]
            for shape in a.shapes:
                for router in order:
                    row = independent.run_shape(shape, router, logdir / f"{i + 1}-{shape}-{router}", tokenizer)
                    rows.append({**row, "round": i})
                    fh.write(json.dumps(rows[-1]) + "\n")
                    fh.flush()
    print("\nper shape and build, per round: figure (ratio to that round's round robin)")
    for shape in a.shapes:
        mine = [x for x in rows if x["workload"] == f"guidellm_{shape}"]
        rr = {x["round"]: x for x in mine if x["router"] == "envoy_round_robin"}
        for r in ["envoy_round_robin"] + [f"cache_aware@{n}" for n in builds]:
            runs = [x for x in mine if x["router"] == r]
            for p in FIGURES:
                cells = []
                for x in runs:
                    v, base = figure(x, p), figure(rr.get(x["round"], {}), p)
                    cells.append("-" if v is None else f"{v:8.3f}" + (f" ({v / base:.3f})" if base else ""))
                print(f"  {shape:10s} {r:18s} {'.'.join(p):13s} " + "  ".join(cells))
            print(f"  {shape:10s} {r:18s} pods / decisions " + " | ".join(
                f"{x['per_pod_requests']} {json.dumps(x['decisions'])}" for x in runs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
