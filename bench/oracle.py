"""The limit in the same run (issue #34): an oracle router beside warmroute on every routing-quality
workload, in paired rounds, and where the gap between them is.

The oracle is `warmroute-loadgen --oracle` (loadgen/src/oracle.rs): before each request it reads
every simulated pod's actual state (`warmroute-sim --debug-state`: the prompt's longest cached
prefix, the queue, and the time to first token the pod's own scheduler and cost model forecast)
and sends the request straight to the pod with the least predicted TTFT. It lives in the client
rather than in a proxy so that no hop adds latency: its decision time is recorded per request
(`route_us`) and kept out of TTFT and E2E, so its rows are placement alone.

warmroute's rows run through one Envoy as in the main table, with the same sims (`--debug-state`)
and the oracle in shadow mode: each request is probed the same way (same load on the pods, same
delay before the send, outside the clock), the oracle's pick is recorded, and the request goes
through Envoy. Both rows of a pair thus pay the probes alike, and each warmroute request says
whether warmroute chose the oracle's pod, and if not why (`gap`):

- placement: the oracle's pod held more of the prompt than warmroute's, and warmroute's pod
  never held that much (the index sent it where the prefix was not);
- eviction: the oracle's pod held more, but warmroute's pod once held at least as much and
  evicted it (what an index that never hears of evictions would still credit);
- load: warmroute's pod held as much as the oracle's, but the oracle's pod had the shorter
  forecast queue.

Tokens lost (the oracle's pod's cached prefix less warmroute's, at decision time) are summed per
class as a share of the prompt tokens: hit-rate points. Each class also sums the forecast TTFT
it cost (warmroute's pod's prediction less the pick's, simulated ms).

Targets, per workload, on the median over paired rounds of the per-round ratios: warmroute's hit
rate >= 0.97x the oracle's, TTFT P95 <= 1.10x the oracle's.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from statistics import median

from measure import loadgen, proc_cpu_s
from quality import counters, row_from
from report import median_present
from scenarios import ROUTERS, TIME_SCALE, sim_args
from warmroute_harness import Fleet

WARMROUTE = "warmroute_cache_aware"
ORACLE = "oracle"
# Every routing-quality workload; `evicting` (chat with a third of its KV) through one gateway.
ORACLE_WORKLOADS = ["agent", "conversation", "chat", "uniform", "evicting"]
ORACLE_ROUNDS = 3
HIT_LIMIT = 0.97
TTFT_LIMIT = 1.10


def _pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def analyse(records: Path, oracle_routes: bool) -> dict:
    """The oracle's view of one run's requests (see the module docs)."""
    recs = [json.loads(line) for line in records.read_text().splitlines() if line.strip()]
    probed = [r for r in recs if r.get("oracle") and r.get("outcome") == "ok"]
    route_us = [r["oracle"]["route_us"] for r in probed]
    predict_us = [max((p or {}).get("predict_us", 0) for p in r["oracle"]["pods"]) for r in probed]
    out: dict = {"requests": len(probed), "route_us_p50": _pct(route_us, 0.5), "route_us_p99": _pct(route_us, 0.99),
                 "predict_us_p50": _pct(predict_us, 0.5), "predict_us_p99": _pct(predict_us, 0.99)}
    prompt_tokens = sum(r.get("prompt_tokens") or 0 for r in probed)
    classes = {c: {"requests": 0, "tokens_lost": 0, "ttft_ms_lost": 0.0} for c in ("same", "placement", "eviction", "load")}
    exact_cached = ttft_ratio = 0
    ratios: list[float] = []
    evicted_on_chosen = 0
    for r in probed:
        o = r["oracle"]
        pods = o["pods"]
        names = [(p or {}).get("replica") for p in pods]
        chosen = names.index(r["replica"]) if r.get("replica") in names else None
        pick = o.get("pick")
        if chosen is None or pick is None or pods[chosen] is None or pods[pick] is None:
            continue
        c, p = pods[chosen], pods[pick]
        bs = c.get("block_size") or 16
        # The chosen pod once held more of this prompt than it holds now (capped as admission caps).
        if min(c["held_blocks"], max(0, (r.get("prompt_tokens") or 0) - 1) // bs) * bs > c["cached_tokens"]:
            evicted_on_chosen += 1
        if oracle_routes:
            # How exact the forecast was: the cached prefix found at admission, and the TTFT.
            if r.get("cached_tokens") == c["cached_tokens"]:
                exact_cached += 1
            if c.get("predicted_ttft_ms") and r.get("ttft_ms"):
                ratios.append(r["ttft_ms"] / (c["predicted_ttft_ms"] / TIME_SCALE))
        if chosen == pick:
            cls = "same"
        else:
            lost = p["cached_tokens"] - c["cached_tokens"]
            if lost > 0:
                cls = "eviction" if c["held_blocks"] * bs >= p["cached_tokens"] else "placement"
            else:
                cls = "load"
        k = classes[cls]
        k["requests"] += 1
        k["tokens_lost"] += max(0, p["cached_tokens"] - c["cached_tokens"])
        if c.get("predicted_ttft_ms") is not None and p.get("predicted_ttft_ms") is not None:
            k["ttft_ms_lost"] += c["predicted_ttft_ms"] - p["predicted_ttft_ms"]
    for k in classes.values():
        k["hit_points_lost"] = k["tokens_lost"] / prompt_tokens if prompt_tokens else None
        k["ttft_ms_lost"] = round(k["ttft_ms_lost"], 1)
    out["gap"] = classes
    out["evicted_on_chosen"] = evicted_on_chosen
    if oracle_routes:
        out["cached_exact"] = exact_cached / len(probed) if probed else None
        out["ttft_measured_over_predicted_p50"] = median(ratios) if ratios else None
    return out


def run_row(b, workload: str, router: str, sink: list[dict]) -> dict:
    """One run on a fresh fleet of sims with `--debug-state`: warmroute through one Envoy with the
    oracle in shadow mode, or the oracle routing (no Envoy)."""
    args, capacity = b.wl(workload)
    b.n += 1
    rdir = b.logdir / f"{b.n:02d}-{workload}-{router}-oracle-section"
    rdir.mkdir(parents=True)
    max_s = 60.0 if b.quick else 150.0
    t0 = time.time()
    routes = router == ORACLE
    kwargs = {} if routes else dict(ROUTERS[router])
    with Fleet(3, sim_args(capacity) + ["--debug-state"], gateways=0 if routes else 1, logdir=rdir, **kwargs) as f:
        pods = [f"http://{s.address}" for s in f.sims]
        extra = ["--records", str(rdir / "records.jsonl")]
        for p in pods:
            extra += ["--oracle-pod", p]
        if routes:
            extra.append("--oracle")
            targets = pods[:1]  # unused: the oracle sends to its pick
        else:
            targets = [f"http://127.0.0.1:{e.port}" for e in f.envoys]
        cpu0 = [proc_cpu_s(e.proc.pid) for e in f.envoys]
        rep = loadgen(args, targets, pods, rdir / "report.json", max_s, extra)
        envoy_cpu = sum(proc_cpu_s(e.proc.pid) for e in f.envoys) - sum(cpu0)
        dec = counters(f.envoys) if f.envoys else {}
    row = row_from(rep, workload=workload, router=router, replicas=3, gateways=0 if routes else 1,
                   kv_capacity_tokens=capacity, time_scale=TIME_SCALE,
                   envoy_cpu_s=round(envoy_cpu, 2) if f.envoys else None, decisions=dec)
    row["oracle"] = analyse(rdir / "records.jsonl", routes)
    return b._keep(row, 0, sink, t0)


def section(b, rounds: int = ORACLE_ROUNDS, workloads: list[str] | None = None,
            out: list[list[dict]] | None = None) -> list[list[dict]]:
    """`rounds` paired rounds: per workload, warmroute and the oracle on fresh fleets, the order
    reversed every other round. Appends one list of rows per round to `out` as it goes."""
    out = [] if out is None else out
    for i in range(rounds):
        print(f"== oracle, round {i + 1} of {rounds}", flush=True)
        rows: list[dict] = []
        out.append(rows)
        for w in workloads or ORACLE_WORKLOADS:
            pair = [WARMROUTE, ORACLE]
            for r in (pair if i % 2 == 0 else pair[::-1]):
                row = run_row(b, w, r, rows)
                row["round"] = i + 1
    return out


def _pairs(rounds: list[list[dict]] | None, w: str) -> list[tuple[dict, dict]]:
    out = []
    for rows in rounds or []:
        a = next((r for r in rows if r["workload"] == w and r["router"] == WARMROUTE), None)
        o = next((r for r in rows if r["workload"] == w and r["router"] == ORACLE), None)
        if a and o and not a.get("errors") and not o.get("errors"):
            out.append((a, o))
    return out


def _workloads(rounds) -> list[str]:
    seen = {r["workload"] for rows in rounds or [] for r in rows}
    return [w for w in ORACLE_WORKLOADS if w in seen]


def targets(rounds: list[list[dict]] | None) -> list[dict]:
    out: list[dict] = []
    for w in _workloads(rounds):
        pairs = _pairs(rounds, w)
        if not pairs:
            continue
        n = len(pairs)
        hr = [a["hit_rate"] / o["hit_rate"] for a, o in pairs if a.get("hit_rate") is not None and o.get("hit_rate")]
        if hr:
            m = median(hr)
            out.append({"target": f"{w}: warmroute hit rate >= {HIT_LIMIT:.2f}x the oracle's",
                        "measured": f"{m:.3f}x median of {len(hr)} paired rounds ({', '.join(f'{x:.3f}' for x in hr)}); "
                                    f"{median(a['hit_rate'] for a, _ in pairs) * 100:.1f}% vs "
                                    f"{median(o['hit_rate'] for _, o in pairs) * 100:.1f}%",
                        "limit": f">= {HIT_LIMIT:.2f}x", "result": "PASS" if m >= HIT_LIMIT else "FAIL"})
        elif all((o.get("hit_rate") or 0) == 0 for _, o in pairs):
            out.append({"target": f"{w}: warmroute hit rate >= {HIT_LIMIT:.2f}x the oracle's",
                        "measured": f"the oracle hits nothing ({n} rounds): no ratio", "limit": f">= {HIT_LIMIT:.2f}x",
                        "result": "n/a"})
        tt = [a["ttft_ms"]["p95"] / o["ttft_ms"]["p95"] for a, o in pairs
              if (a.get("ttft_ms") or {}).get("p95") and (o.get("ttft_ms") or {}).get("p95")]
        if tt:
            m = median(tt)
            out.append({"target": f"{w}: warmroute TTFT P95 <= {TTFT_LIMIT:.2f}x the oracle's",
                        "measured": f"{m:.2f}x median of {len(tt)} paired rounds ({', '.join(f'{x:.2f}' for x in tt)}); "
                                    f"{median(a['ttft_ms']['p95'] for a, _ in pairs):.0f} vs "
                                    f"{median(o['ttft_ms']['p95'] for _, o in pairs):.0f} ms",
                        "limit": f"<= {TTFT_LIMIT:.2f}x", "result": "PASS" if m <= TTFT_LIMIT else "FAIL"})
    return out


def _f(x, fmt: str, scale: float = 1.0) -> str:
    return "" if x is None else format(x * scale, fmt)


def markdown(rounds: list[list[dict]] | None) -> list[str]:
    L: list[str] = []
    ws = _workloads(rounds)
    if not ws:
        return L
    n = len(rounds or [])
    L.append("\n## The limit: an oracle router\n")
    L.append(f"The oracle reads every sim's actual cache and queue before each request (`--debug-state`, never "
             f"read by warmroute) and sends it to the pod whose own scheduler forecasts the least TTFT; it routes "
             f"from the client, its decision kept out of TTFT. warmroute (cache_aware, one Envoy) runs beside it "
             f"with the same probes in shadow mode. {n} paired rounds, the order reversed every other round; "
             f"medians over the rounds without errors. `bench/oracle.py` says how the gap is classed.\n")
    L.append("| workload | router | runs | hit rate | TTFT p50 | TTFT p95 | E2E mean | chose the oracle's pod | "
             "placement | eviction | load | hit lost: placement / eviction | decision p50 / p99 |")
    L.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for w in ws:
        for router in (WARMROUTE, ORACLE):
            rs = [r for rows in rounds or [] for r in rows if r["workload"] == w and r["router"] == router
                  and not r.get("errors")]
            if not rs:
                continue
            g = lambda k: median_present([r["oracle"]["gap"][k]["requests"] / max(1, r["oracle"]["requests"]) for r in rs])
            pts = lambda k: median_present([r["oracle"]["gap"][k]["hit_points_lost"] for r in rs])
            L.append(f"| {w} | {router} | {len(rs)} | {_f(median_present([r['hit_rate'] for r in rs]), '.1f', 100)}% | "
                     f"{_f(median_present([(r['ttft_ms'] or {}).get('p50') for r in rs]), '.0f')} | "
                     f"{_f(median_present([(r['ttft_ms'] or {}).get('p95') for r in rs]), '.0f')} | "
                     f"{_f(median_present([(r['e2e_ms'] or {}).get('mean') for r in rs]), '.0f')} | "
                     f"{_f(g('same'), '.0f', 100)}% | {_f(g('placement'), '.0f', 100)}% | "
                     f"{_f(g('eviction'), '.0f', 100)}% | {_f(g('load'), '.0f', 100)}% | "
                     f"{_f(pts('placement'), '.1f', 100)} / {_f(pts('eviction'), '.1f', 100)} pts | "
                     f"{_f(median_present([r['oracle']['route_us_p50'] for r in rs]), '.0f')} / "
                     f"{_f(median_present([r['oracle']['route_us_p99'] for r in rs]), '.0f')} us |")
    L.append("")
    ex = [(w, r["oracle"]) for rows in rounds or [] for r in rows if r["router"] == ORACLE for w in [r["workload"]]]
    if ex:
        L.append("The forecast against what happened, oracle rows (medians over rounds): the share of requests that "
                 "found exactly the cached prefix the probe reported, and measured TTFT / forecast TTFT (the client's "
                 "wall ms against the pod's simulated ms / time scale; above 1 by the HTTP and streaming path the "
                 "forecast leaves out, and by arrivals after the probe).\n")
        for w in ws:
            os_ = [o for ww, o in ex if ww == w]
            L.append(f"- {w}: cached prefix exact {_f(median_present([o.get('cached_exact') for o in os_]), '.1f', 100)}%, "
                     f"TTFT measured/forecast {_f(median_present([o.get('ttft_measured_over_predicted_p50') for o in os_]), '.2f')}x, "
                     f"forecast {_f(median_present([o.get('predict_us_p50') for o in os_]), '.0f')} us per pod (p50)")
        L.append("")
    return L
