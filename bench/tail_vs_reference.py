"""The conversation trace's TTFT tail against the ideal: warmroute over 3 replicas beside the
single-replica reference (the fleet's whole KV and compute in one replica), pooled over paired
rounds (issue #34).

    cd bench && flock /tmp/warmroute-heavy.lock ../.venv/bin/python tail_vs_reference.py --rounds 5

Round robin's own P95 scatters about 2x between runs on this trace, so a ratio to it decides
little; the reference does not route, so it scatters less. Each round runs both on fresh
fleets, in an order that alternates by round (the machine's speed drifts over minutes). The
figure is the P95 of every round's TTFTs pooled, over the reference's pooled P95: each round's
own P95 rests on its ~40 slowest of 800 requests, the pooled one on ~200 of 4,000. The median
of the rounds' own ratios is printed beside it. Target: ≤ 1.40x. The fluid model of
`conversation_tail.py` (no decode steps, no KV limit) puts a router that knows every backlog
at 1.16x, and one that counts a prompt until it answers at 1.22x; a per-pod clock of prefill
progress, the lever issue #34 named, changed nothing measured here:
docs/decisions/0028-no-prefill-clock.md.
Also the `tail` section of `bench/run.py`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from quality import Bench, row_key
from report import print_targets
from scenarios import TIME_SCALE

ROUNDS, TARGET = 5, 1.40
PAIR = ("reference_1_replica_3x", "warmroute_cache_aware")


def pct(xs: list[float], q: float) -> float:
    """The quantile the load generator's report uses (linear between closest ranks)."""
    s = sorted(xs)
    h = (len(s) - 1) * q
    lo = int(h)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (h - lo) * (s[hi] - s[lo])


def ttfts(bench: Bench, records: Path | None = None) -> list[float]:
    """The TTFTs of the run `bench` made last (or of the run whose `records` these are)."""
    if records is None:
        (rdir,) = bench.logdir.glob(f"{bench.n:02d}-*")
        records = rdir / "records.jsonl"
    recs = (json.loads(x) for x in records.read_text().splitlines() if x.strip())
    return [r["ttft_ms"] for r in recs if r.get("outcome") == "ok" and r.get("ttft_ms") is not None]


def main_pair(bench: Bench, workload: str) -> dict | None:
    """The pair the main table measured on `workload` this run (its section runs the reference
    first, then the routers: the order of an even round), as round 0's rows; None if it did not."""
    _, cap = bench.wl(workload)
    rows = {PAIR[0]: bench.main_row(workload, PAIR[0], replicas=1, capacity=3 * cap),
            PAIR[1]: bench.main_row(workload, PAIR[1])}
    if not all(rows.values()):
        return None
    return {k: {**r, "reused": True, "records": bench.records[row_key(r)]} for k, r in rows.items()}


def rounds(bench: Bench, n: int, workload: str = "conversation", reuse_main: bool = False) -> dict:
    """`n` paired rounds; per router, every round's TTFTs and rows. With `reuse_main` (the fast
    profile), round 0 is the main table's pair of this run when it has one (`main_pair`)."""
    _, cap = bench.wl(workload)
    got: dict = {r: {"ttft": [], "rows": []} for r in PAIR}
    for i in range(n):
        have = main_pair(bench, workload) if reuse_main and i == 0 else None
        if have:
            for router, row in have.items():
                got[router]["ttft"].append(ttfts(bench, row.pop("records")))
                got[router]["rows"].append(row)
                print(f"  {workload:12s} {router:28s} the row measured above", flush=True)
            continue
        for router in (PAIR if i % 2 == 0 else PAIR[::-1]):
            if router == "reference_1_replica_3x":
                row = bench.quality(workload, "reference", replicas=1, capacity=3 * cap, scale=3 * TIME_SCALE,
                                    label=router, sink=[])
            else:
                row = bench.quality(workload, router, sink=[])
            got[router]["ttft"].append(ttfts(bench))
            got[router]["rows"].append(row)
    return got


def summary(got: dict) -> dict:
    ref, ca = got[PAIR[0]]["ttft"], got[PAIR[1]]["ttft"]
    pooled_ref, pooled_ca = pct([x for r in ref for x in r], 0.95), pct([x for r in ca for x in r], 0.95)
    per_round = [pct(c, 0.95) / pct(r, 0.95) for r, c in zip(ref, ca) if r and c]
    return {"rounds": len(per_round), "pooled_p95_ms": {"reference": pooled_ref, "warmroute": pooled_ca},
            "pooled_ratio": pooled_ca / pooled_ref, "round_ratios": per_round,
            "median_round_ratio": statistics.median(per_round) if per_round else None,
            "hit_rate": {k: [row["hit_rate"] for row in v["rows"]] for k, v in got.items()},
            "requests": {k: sum(len(x) for x in v["ttft"]) for k, v in got.items()}}


def report(s: dict) -> None:
    print(f"\nconversation TTFT P95 over {s['rounds']} paired rounds, pooled: warmroute "
          f"{s['pooled_p95_ms']['warmroute']:.0f} ms vs the reference {s['pooled_p95_ms']['reference']:.0f} ms = "
          f"{s['pooled_ratio']:.3f}x; rounds' own ratios {', '.join(f'{x:.3f}' for x in s['round_ratios'])} "
          f"(median {s['median_round_ratio']:.3f})")


def targets(s: dict | None) -> list[dict]:
    if not s or not s.get("rounds"):
        return []
    return [{"target": f"conversation: cache_aware TTFT P95 <= {TARGET:.2f}x the single-replica reference, "
                       f"pooled over >= {ROUNDS} paired rounds",
             "measured": f"{s['pooled_ratio']:.3f}x pooled over {s['rounds']} paired rounds "
                         f"({s['pooled_p95_ms']['warmroute']:.0f} vs {s['pooled_p95_ms']['reference']:.0f} ms; "
                         f"{s['requests']['warmroute_cache_aware']} requests each side; rounds' own ratios median "
                         f"{s['median_round_ratio']:.3f}x)",
             "limit": f"<= {TARGET:.2f}x" + ("" if s["rounds"] >= ROUNDS else f", >= {ROUNDS} rounds"),
             "result": "PASS" if s["pooled_ratio"] <= TARGET and s["rounds"] >= ROUNDS else "FAIL"}]


def section(bench: Bench, quick: bool, reuse_main: bool = False) -> dict:
    """`make bench`'s section: 5 paired rounds (2 when quick, which then cannot pass); with
    `reuse_main`, the first is the main table's conversation pair of this run (see `rounds`)."""
    print(f"== conversation tail vs the single-replica reference ({2 if quick else ROUNDS} paired rounds)", flush=True)
    s = summary(rounds(bench, 2 if quick else ROUNDS, reuse_main=reuse_main))
    report(s)
    return s


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=ROUNDS)
    a = ap.parse_args()
    bench = Bench(quick=False, logdir=Path(tempfile.mkdtemp(prefix="warmroute-tail-")))
    s = summary(rounds(bench, a.rounds))
    report(s)
    print_targets(targets(s))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
