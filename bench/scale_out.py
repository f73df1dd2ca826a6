"""Scaling out the gateway: 3 replicas against 1, with and without the exchange, in paired rounds.

    cd bench && flock /tmp/warmroute-heavy.lock ../.venv/bin/python scale_out.py --rounds 3

Per round and workload, three rows on fresh fleets in an order that rotates each round: one
gateway (`warmroute_cache_aware`), three gateways without the exchange (the same router), three
gateways that pull each other's placements (`warmroute_cache_aware_peers`, the load generator
spreading requests over them). A ratio is taken within its round (the machine's speed drifts
between rounds); the verdict is the median over rounds. Targets (issue #33): with the exchange,
3 gateways ≥ 0.97× one gateway's hit rate and ≤ 1.05× its TTFT P95 on every workload. Also
prints the replicas' Envoy CPU per request against one gateway's (`exchange_cost.py` measures
that apart from the workloads) and the peers' pulls and imported events. Also the `scale_out`
section of `bench/run.py`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from quality import Bench, row_key
from report import print_targets

ROWS = [("1g", "warmroute_cache_aware", 1), ("3g", "warmroute_cache_aware", 3),
        ("3g+peers", "warmroute_cache_aware_peers", 3)]
WORKLOADS = ["agent", "chat", "conversation", "evicting"]
HIT_TARGET, P95_TARGET = 0.97, 1.05


def measured_1g(bench: Bench, workload: str, rows: list[dict]) -> dict | None:
    """One gateway's row of `workload` that this run already measured: the main table's
    (agent, chat, conversation) or among `rows` (the peers section's warmroute row of
    `evicting`): the same router, fleet and workload."""
    key = (workload, "warmroute_cache_aware", 3, 1, bench.wl(workload)[1])
    return bench.main_row(*key[:2]) or next((r for r in rows if row_key(r) == key), None)


def rounds(bench: Bench, n: int, workloads: list[str], out: Path | None = None,
           setups: list[str] | None = None, reuse_1g: list[dict] | None = None) -> list[dict]:
    """`n` paired rounds: every setup of `ROWS` (or those labelled in `setups`) on each
    workload, the setups' order rotating. With `reuse_1g` (the fast profile: the rows of this
    run's sections so far), round 0's one-gateway rows are those this run measured already
    (`measured_1g`) where it did."""
    rows: list[dict] = []
    mine = [r for r in ROWS if setups is None or r[0] in setups]
    for i in range(n):
        order = mine[i % len(mine):] + mine[:i % len(mine)]
        for w in workloads:
            for label, router, gateways in order:
                have = measured_1g(bench, w, reuse_1g) if reuse_1g is not None and i == 0 and label == "1g" else None
                if have:
                    row = {**have, "reused": True}
                    print(f"  {w:12s} {router}/{label} the row measured above", flush=True)
                else:
                    row = bench.quality(w, router, gateways=gateways, label=f"{router}/{label}", sink=[])
                rows.append({**row, "round": i, "setup": label})
                if out:
                    with open(out, "a") as fh:
                        fh.write(json.dumps(rows[-1]) + "\n")
    return rows


def summary(rows: list[dict]) -> dict:
    """Per workload and setup: each round's figures, and the median of the within-round
    ratios to one gateway."""
    out: dict = {"rounds": len({r["round"] for r in rows}), "workloads": {}}
    for w in dict.fromkeys(r["workload"] for r in rows):
        def of(setup: str) -> list[dict]:
            return sorted((r for r in rows if r["workload"] == w and r["setup"] == setup), key=lambda r: r["round"])

        one, per = of("1g"), {}
        for setup in ("1g", "3g", "3g+peers"):
            mine = of(setup)
            if not mine:
                continue
            s = {"hit": [r["hit_rate"] or 0 for r in mine],
                 "p95": [(r["ttft_ms"] or {}).get("p95", 0) for r in mine],
                 "cpu_ms_per_req": [r["envoy_cpu_s"] / max(r["ok"] or 1, 1) * 1e3 for r in mine],
                 "errors": sum(r["errors"] or 0 for r in mine)}
            pairs = [(m, o) for m, o in zip(mine, one) if o["hit_rate"] and (o["ttft_ms"] or {}).get("p95")]
            if setup != "1g" and pairs:
                s["hit_ratio"] = statistics.median(m["hit_rate"] / o["hit_rate"] for m, o in pairs)
                s["p95_ratio"] = statistics.median(m["ttft_ms"]["p95"] / o["ttft_ms"]["p95"] for m, o in pairs)
                s["cpu_ratio"] = statistics.median(
                    (m["envoy_cpu_s"] / max(m["ok"], 1)) / (o["envoy_cpu_s"] / max(o["ok"], 1)) for m, o in pairs)
            if setup == "3g+peers":
                s["exchange"] = [{k: v for k, v in (r.get("decisions") or {}).items() if k.startswith("peers")}
                                 for r in mine]
            per[setup] = s
        out["workloads"][w] = per
    return out


def report(s: dict) -> None:
    print(f"\n{s['rounds']} rounds; per workload: each setup's figure per round, then the median of its "
          "ratio to 1g within each round")
    for w, per in s["workloads"].items():
        for setup, m in per.items():
            line = (f"  {w:12s} {setup:9s} hit {' '.join(f'{x:.3f}' for x in m['hit'])}"
                    f"  ttft p95 {' '.join(f'{x:.0f}' for x in m['p95'])}"
                    f"  envoy ms cpu/req {' '.join(f'{x:.2f}' for x in m['cpu_ms_per_req'])}")
            if "hit_ratio" in m:
                line += (f"  | median ratio to 1g: hit {m['hit_ratio']:.3f}  ttft p95 {m['p95_ratio']:.3f}"
                         f"  cpu/req {m['cpu_ratio']:.2f}")
            print(line)
        print(f"  {w:12s} exchange: " + " | ".join(json.dumps(d) for d in per.get("3g+peers", {}).get("exchange", [])))


def targets(s: dict | None) -> list[dict]:
    if not s:
        return []
    out = []
    for w, per in s["workloads"].items():
        on, off = per.get("3g+peers", {}), per.get("3g", {})
        if "hit_ratio" not in on:
            continue
        for key, name, limit, ok in (("hit_ratio", "hit rate", f">= {HIT_TARGET:.2f}x", on["hit_ratio"] >= HIT_TARGET),
                                     ("p95_ratio", "TTFT P95", f"<= {P95_TARGET:.2f}x", on["p95_ratio"] <= P95_TARGET)):
            without = f"; without the exchange {off[key]:.3f}x" if key in off else ""
            out.append({"target": f"{w}: 3 gateway replicas with the exchange, {name} vs 1 gateway",
                        "measured": f"{on[key]:.3f}x median of {s['rounds']} paired rounds{without}",
                        "limit": limit, "result": "PASS" if ok else "FAIL"})
    return out


def section(bench: Bench, quick: bool, n: int = 2, setups: list[str] | None = None,
            reuse_1g: list[dict] | None = None) -> dict:
    """`make bench`'s section: `n` paired rounds of 1, 3 and 3 exchanging gateways (`setups`, by
    label: the fast profile leaves out 3 without the exchange) on every workload; `reuse_1g`,
    see `rounds`."""
    print("== scale-out (1 gateway, 3, 3 with the exchange)", flush=True)
    s = summary(rounds(bench, 1 if quick else n, ["agent"] if quick else WORKLOADS, setups=setups,
                       reuse_1g=reuse_1g))
    report(s)
    return s


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workloads", nargs="+", default=WORKLOADS)
    ap.add_argument("--out", default="scale_out.jsonl")
    a = ap.parse_args()
    Path(a.out).write_text("")
    bench = Bench(quick=False, logdir=Path(tempfile.mkdtemp(prefix="warmroute-scale-out-")))
    s = summary(rounds(bench, a.rounds, a.workloads, Path(a.out)))
    report(s)
    print_targets(targets(s))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
