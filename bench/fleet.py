"""Cost at fleet scale (issue #18): one gateway in front of 100 pods at 100 requests/s, and the
same traffic as Envoy's workers grow.

`fleet` puts warmroute (cache_aware, endpoint mode, 100 backends scraped every 500 ms) and a
no-filter round-robin Envoy side by side in front of the same instant backend: one Envoy with
100 listeners, each a pod answering at once with a vLLM-shaped /metrics (KV capacity included, so
each pod's index share is a real pod's and `index.max_blocks` is the bound that binds). An
open-loop client sends the same Poisson traffic through each gateway in alternating rounds
(A B, B A, ...): the cores each gateway used over the window (CPU seconds / wall seconds, from
/proc), the latency it added (paired per-round p50/p99 differences) and Envoy's memory. The
client's own rate and CPU are reported with it: a figure at a rate the client did not reach
is labelled with the rate it did.

`workers` sends the same traffic through warmroute at `--concurrency` 1, 2, 4, 8 (each worker's VM
holds an index replica and replays the shared log): CPU per request over each run's window as a
ratio to 1 worker (a no-filter Envoy at the same concurrency beside it), and Envoy's RSS growth per
worker with the default `index.max_blocks` and a small one, after that traffic and after filling
the index past its bound with distinct prompts.

The traffic is a synthetic Mooncake-style trace replayed by `warmroute-loadgen conversation`:
a quarter of the prompts are 100k tokens (one of 8 shared documents of ~96k tokens, then 4k
tokens of their own), the rest 4k tokens (one of 20 shared system prompts of 3k tokens, then 1k
of their own). Trace blocks are 512 tokens; at `--length-scale 0.5` a token is half a generated
word, ~5 bytes, so a 100k-token body is ~500 KB and a 4k one ~20 KB (BPE text runs ~4 bytes per
token).
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path
from statistics import median

from measure import loadgen, proc_cpu_s, proc_rss_kb
from overhead import InstantBackend, METRICS_BODY, envoy_memory
from warmroute_harness import Envoy, free_port

PODS = 100
RATE = 100.0
BLOCK_TOKENS = 512  # the Mooncake trace's block
LENGTH_SCALE = 0.5  # trace tokens -> generated words
# What each instant pod reports as its KV capacity: 30k blocks of 16 tokens (480k tokens, an
# 8B model on an 80 GB GPU). 100 of them hold far more than the default index.max_blocks, so the
# index's own bound is what limits its memory, as on a real fleet this size.
CACHE_INFO = 'vllm:cache_config_info{block_size="16",enable_prefix_caching="True",num_gpu_blocks="30000"} 1\n'
# The traffic shape: (share of requests, prompt tokens, shared prefix tokens, distinct prefixes).
SHAPES = ((0.25, 100_000, 96_256, 8), (0.75, 4_096, 3_072, 20))
# The index bound of the workers section's second configuration (default 262144).
SMALL_MAX_BLOCKS = 16_384
CONCURRENCIES = (1, 2, 4, 8)
# The workers section then fills the index with distinct prompts of this many words (~17 KB,
# ~66 index blocks each): 8000 of them are ~530k blocks, twice the default index.max_blocks.
FILL_WORDS = 2000
# Published figures this compares with, quoted from the llm-d router's operations guide
# (container sizing: https://llm-d.ai/docs/dev/resources/operations/router, source
# docs/operations.md in llm-d-router), as issue #18 states them.
EXTERNAL = {
    "source": "llm-d Router operations guide (container sizing), llm-d.ai/docs/dev/resources/operations/router",
    "pods": 100, "prompt_tokens": "up to ~100k (agentic: ~100k in / 1k out)", "rps": 99,
    "cores": "35-46 (EPP; rule of thumb 0.5-1.0 core per request/s)", "idle_cores": "~7.5 (100 pods, metric scraping)",
    "scheduler_p50_ms": "0.10-0.20",
}


class FleetBackend(InstantBackend):
    """The instant backend whose pods also report their KV capacity (vllm:cache_config_info),
    on 100 distinct ports (free_port() may hand out a port twice among so many)."""

    def __init__(self, replicas: int, logdir: Path):
        super().__init__(replicas, logdir)
        taken = {self.admin}
        for i, p in enumerate(self.ports):
            while p in taken:
                p = free_port()
            taken.add(p)
            self.ports[i] = p

    def config(self) -> dict:
        cfg = super().config()
        for listener in cfg["static_resources"]["listeners"]:
            hcm = listener["filter_chains"][0]["filters"][0]["typed_config"]
            for route in hcm["route_config"]["virtual_hosts"][0]["routes"]:
                body = route["direct_response"]["body"]
                if body["inline_string"] == METRICS_BODY:
                    body["inline_string"] = METRICS_BODY + CACHE_INFO
        return cfg


def write_trace(path: Path, seconds: float, rate: float, seed: int) -> int:
    """A Poisson trace of `seconds` at `rate`: each line one of SHAPES' shared prefixes (its
    512-token blocks' ids) followed by blocks of its own. Returns the number of lines."""
    rng = random.Random(seed)
    next_id = 0
    prefixes: list[list[list[int]]] = []
    for _, _, shared, n in SHAPES:
        group = []
        for _ in range(n):
            group.append(list(range(next_id, next_id + shared // BLOCK_TOKENS)))
            next_id += shared // BLOCK_TOKENS
        prefixes.append(group)
    lines, t = [], 0.0
    while t < seconds * 1000:
        r, k = rng.random(), 0
        while k < len(SHAPES) - 1 and r >= SHAPES[k][0]:
            r -= SHAPES[k][0]
            k += 1
        tokens, shared = SHAPES[k][1], SHAPES[k][2]
        own = -(-(tokens - shared) // BLOCK_TOKENS)
        ids = rng.choice(prefixes[k]) + list(range(next_id, next_id + own))
        next_id += own
        lines.append(json.dumps({"timestamp": round(t, 3), "input_length": tokens, "output_length": 1,
                                 "hash_ids": ids}))
        t += rng.expovariate(rate) * 1000
    path.write_text("\n".join(lines) + "\n")
    return len(lines)


def send(trace: Path, n: int, target: str, out: Path, seconds: float) -> dict:
    """The whole trace, open loop, through `target`."""
    return loadgen(["conversation", "--trace", str(trace), "--speedup", "1", "--length-scale", str(LENGTH_SCALE),
                    "--output-scale", "1", "--limit", str(n), "--api", "chat"],
                   [target], [], out, seconds + 60, ["--threads", "1"])


def window(e: Envoy, trace: Path, n: int, out: Path, seconds: float) -> dict:
    """One open-loop run through `e`: the report plus Envoy's CPU seconds and wall seconds."""
    c0 = proc_cpu_s(e.proc.pid)
    rep = send(trace, n, f"http://127.0.0.1:{e.port}", out, seconds)
    cpu = proc_cpu_s(e.proc.pid) - c0
    # Over the client's sending time, not its whole run: it renders every body before the first
    # is sent (about a second for this trace), while the gateway only ticks.
    wall = max(rep["runtime_s"], 1e-9)
    return {"rep": rep, "cpu_s": cpu, "wall_s": wall, "cores": cpu / wall, "rps": rep["ok"] / wall,
            "p50_ms": rep["e2e_ms"]["p50"], "p99_ms": rep["e2e_ms"]["p99"], "errors": rep["errors"] + rep["aborted"],
            "client_cpu_util": rep["client_cpu_util"], "cpu_us_per_req": cpu / max(rep["ok"], 1) * 1e6}


def idle_cores(gw: dict[str, Envoy], seconds: float) -> dict[str, float]:
    """Each Envoy's cores with no traffic: its ticks (for warmroute, scraping every pod). Over
    one window for all: each idles beside the others whether its window is theirs or not."""
    c0, t0 = {g: proc_cpu_s(e.proc.pid) for g, e in gw.items()}, time.monotonic()
    time.sleep(seconds)
    wall = time.monotonic() - t0
    return {g: (proc_cpu_s(e.proc.pid) - c0[g]) / wall for g, e in gw.items()}


def routed(e: Envoy) -> dict:
    """What the filter did: decisions, fallbacks, matched share, scrapes (settled at a tick)."""
    return {k.removeprefix("wasmcustom."): int(v) for k, v in e.settled_stats().items()
            if k.startswith("wasmcustom.warmroute.") and v.isdigit() and int(v)
            and any(p in k for p in (".decision.", ".fallback.", "prompt_blocks", "matched_blocks", ".scrape.",
                                     "log_gaps", "host_errors"))}


def fleet_section(logdir: Path, quick: bool, rounds: int | None = None) -> dict:
    """100 pods at 100 requests/s: warmroute against a no-filter Envoy, paired rounds (`rounds`
    of the full run's length when given)."""
    n, seconds, workers = (2, 8.0, 2) if quick else (4, 15.0, 2)
    rounds = rounds or n
    print(f"== fleet: {PODS} pods, {RATE:.0f} req/s open loop, {rounds} paired rounds of {seconds:.0f} s, "
          f"{workers} workers", flush=True)
    rdir = logdir / "fleet"
    rdir.mkdir()
    out: dict = {"pods": PODS, "rate": RATE, "rounds": rounds, "seconds": seconds, "workers": workers,
                 "shapes": [{"share": s, "tokens": t, "shared_tokens": p, "prefixes": n} for s, t, p, n in SHAPES],
                 "external": EXTERNAL}
    with FleetBackend(PODS, rdir) as be:
        gw = {"nofilter": Envoy(be.sims(), concurrency=workers, with_filter=False, lb="round_robin"),
              "warmroute": Envoy(be.sims(), concurrency=workers, filter_overrides={"debug_header": False})}
        for e in gw.values():
            e.start(rdir)
        per: dict = {g: [] for g in gw}
        try:
            warm = rdir / "warm.jsonl"
            nw = write_trace(warm, 2, RATE, 99)
            for g, e in gw.items():  # connections, VMs, every pod scraped once
                send(warm, nw, f"http://127.0.0.1:{e.port}", rdir / f"warm-{g}.json", 10)
            out["idle_cores"] = idle_cores(gw, 5.0)
            mem0 = envoy_memory(gw["warmroute"])
            rss0 = {g: proc_rss_kb(e.proc.pid) for g, e in gw.items()}
            for r in range(rounds):
                trace = rdir / f"r{r}.jsonl"
                n = write_trace(trace, seconds, RATE, r)
                for g in (("nofilter", "warmroute") if r % 2 == 0 else ("warmroute", "nofilter")):
                    w = window(gw[g], trace, n, rdir / f"r{r}-{g}.json", seconds)
                    w["requests"] = n
                    per[g].append(w)
                    print(f"  r{r} {g:9s} {w['rps']:5.1f} req/s ({w['rep']['ok']}/{n} ok, {w['errors']} err), "
                          f"Envoy {w['cores']:.3f} cores, p50 {w['p50_ms']:.2f} ms p99 {w['p99_ms']:.2f} ms, "
                          f"client CPU {w['client_cpu_util']:.2f}", flush=True)
            mem1 = envoy_memory(gw["warmroute"])
            out["routed"] = routed(gw["warmroute"])
            out["rss_kb"] = {g: [rss0[g], proc_rss_kb(e.proc.pid)] for g, e in gw.items()}
        finally:
            for e in gw.values():
                e.stop()
    keys = ("cores", "rps", "p50_ms", "p99_ms", "client_cpu_util", "cpu_us_per_req", "errors")
    out["runs"] = {g: [{k: w[k] for k in keys} for w in ws] for g, ws in per.items()}
    med = {g: {k: median(w[k] for w in ws) for k in keys} for g, ws in per.items()}
    pairs = list(zip(per["nofilter"], per["warmroute"]))
    out["median"] = med
    out["filter_cores"] = median(b["cores"] - a["cores"] for a, b in pairs)
    out["added_p50_ms"] = median(b["p50_ms"] - a["p50_ms"] for a, b in pairs)
    out["added_p99_ms"] = median(b["p99_ms"] - a["p99_ms"] for a, b in pairs)
    out["achieved_rps"] = min(w["rps"] for ws in per.values() for w in ws)
    out["cores_per_100rps"] = med["warmroute"]["cores"] / med["warmroute"]["rps"] * 100
    # What each Envoy grew by over the rounds; the no-filter one's growth (connections, buffers)
    # is what the same traffic costs without an index. The index filled to its bound is measured
    # by the workers section.
    growth = {g: b - a for g, (a, b) in out["rss_kb"].items()}
    out["memory"] = {"before": mem0, "after": mem1, "rss_growth_kb": growth}
    w = med["warmroute"]
    print(f"  warmroute gateway: {w['cores']:.3f} cores at {w['rps']:.1f} req/s (no filter {med['nofilter']['cores']:.3f}; "
          f"the filter's share {out['filter_cores']:.3f}); idle {out['idle_cores']['warmroute']:.3f} "
          f"(no filter {out['idle_cores']['nofilter']:.3f}); added p50 {out['added_p50_ms'] * 1000:.0f} us, "
          f"p99 {out['added_p99_ms'] * 1000:.0f} us; RSS growth {growth['warmroute']} kB "
          f"(no filter {growth['nofilter']} kB)", flush=True)
    return out


def workers_section(logdir: Path, quick: bool) -> dict:
    """The same traffic at --concurrency 1, 2, 4, 8: CPU per request and memory per worker."""
    seconds, fill_n = (6.0, 2000) if quick else (10.0, 8000)
    print(f"== workers: the fleet traffic ({seconds:.0f} s) at concurrency {', '.join(map(str, CONCURRENCIES))}",
          flush=True)
    rdir = logdir / "workers"
    rdir.mkdir()
    trace = rdir / "trace.jsonl"
    n = write_trace(trace, seconds, RATE, 7)
    gateways = {"nofilter": {"with_filter": False, "lb": "round_robin"},
                "warmroute": {"filter_overrides": {"debug_header": False}},
                f"warmroute-{SMALL_MAX_BLOCKS}": {"filter_overrides": {"debug_header": False,
                                                                       "index": {"max_blocks": SMALL_MAX_BLOCKS}}}}
    rows = []
    with FleetBackend(PODS, rdir) as be:
        for c in CONCURRENCIES:
            for g, kw in gateways.items():
                e = Envoy(be.sims(), concurrency=c, **kw)
                e.start(rdir)
                try:
                    send(trace, min(n, 50), f"http://127.0.0.1:{e.port}", rdir / f"c{c}-{g}-warm.json", 10)
                    time.sleep(1)
                    rss0 = proc_rss_kb(e.proc.pid)
                    w = window(e, trace, n, rdir / f"c{c}-{g}.json", seconds)
                    time.sleep(1)
                    rss1 = proc_rss_kb(e.proc.pid)
                    rss2, gaps = rss1, 0
                    if e.with_filter:  # fill the index past its bound with distinct prompts
                        fill = loadgen(["uniform", "--api", "chat", "--prompt-tokens", str(FILL_WORDS),
                                        "--output-tokens", "1", "--requests", str(fill_n), "--rate", "1000000",
                                        "--seed", str(c)], [f"http://127.0.0.1:{e.port}"], [],
                                       rdir / f"c{c}-{g}-fill.json", 120, ["--concurrency", "16"])
                        time.sleep(1)
                        rss2 = proc_rss_kb(e.proc.pid)
                        gaps = e.stat("wasmcustom.warmroute.index.log_gaps", e.settled_stats())
                        w["errors"] += fill["errors"] + fill["aborted"]
                finally:
                    e.stop()
                row = {"concurrency": c, "gateway": g, "cpu_us_per_req": w["cpu_us_per_req"], "cores": w["cores"],
                       "rps": w["rps"], "errors": w["errors"], "rss_kb_before": rss0, "rss_kb_after": rss1,
                       "rss_growth_kb_per_worker": (rss1 - rss0) / c, "p50_ms": w["p50_ms"],
                       "rss_kb_filled": rss2, "filled_kb_per_worker": (rss2 - rss0) / c, "log_gaps": gaps}
                rows.append(row)
                print(f"  c{c} {g:16s} {row['cpu_us_per_req']:7.0f} us CPU/req  {row['rps']:5.1f} req/s  "
                      f"RSS {rss0} -> {rss1} kB ({row['rss_growth_kb_per_worker']:.0f} kB/worker), "
                      f"after the fill {rss2} kB ({row['filled_kb_per_worker']:.0f} kB/worker)  err {row['errors']}  "
                      f"log_gaps {gaps}", flush=True)
    base = {r["gateway"]: r["cpu_us_per_req"] for r in rows if r["concurrency"] == 1}
    for r in rows:
        r["cpu_ratio_vs_1"] = r["cpu_us_per_req"] / max(base[r["gateway"]], 1e-9)
    return {"seconds": seconds, "requests": n, "small_max_blocks": SMALL_MAX_BLOCKS, "fill_requests": fill_n,
            "fill_words": FILL_WORDS, "rows": rows}


def section(logdir: Path, quick: bool, rounds: int | None = None, workers: bool = True) -> dict:
    """The fleet's paired rounds, then (unless `workers` is False) the worker-scaling table."""
    out = {"fleet": fleet_section(logdir, quick, rounds)}
    if workers:
        out["workers"] = workers_section(logdir, quick)
    return out


def targets(fl: dict | None) -> list[dict]:
    """Issue #18's scale target: the gateway with warmroute under one core at 100 pods, 100 req/s."""
    f = (fl or {}).get("fleet")
    if not f:
        return []
    w = f["median"]["warmroute"]
    rate = f"{w['rps']:.0f} req/s" + ("" if f["achieved_rps"] >= 0.95 * f["rate"] else
                                      f" (the client reached no more: {f['achieved_rps']:.0f} at worst)")
    return [{"target": f"fleet: gateway cores with warmroute, {f['pods']} pods, {f['rate']:.0f} req/s of 4k/100k-token "
                       "prompts < 1 core",
             "measured": f"{w['cores']:.3f} cores at {rate}, median of {f['rounds']} rounds (no filter "
                         f"{f['median']['nofilter']['cores']:.3f}; the filter's share {f['filter_cores']:.3f})",
             "limit": "< 1 core", "result": "PASS" if w["cores"] < 1.0 else "FAIL"}]


def markdown(fl: dict) -> list[str]:
    """The fleet and workers tables of latest.md, beside the published figures."""
    L: list[str] = []
    f = fl.get("fleet")
    if f:
        shapes = "; ".join(f"{s['share'] * 100:.0f}% {s['tokens'] // 1000}k tokens sharing one of {s['prefixes']} "
                           f"prefixes of {s['shared_tokens'] // 1000}k" for s in f["shapes"])
        L.append(f"## Fleet scale: {f['pods']} pods, {f['rate']:.0f} req/s\n")
        L.append(f"One gateway ({f['workers']} workers) in front of {f['pods']} instant pods (one Envoy, one listener "
                 f"each, vLLM-shaped /metrics scraped every 500 ms), open-loop Poisson traffic: {shapes}. "
                 f"{f['rounds']} alternating rounds of {f['seconds']:.0f} s through warmroute (cache_aware, endpoint "
                 "mode) and a no-filter round-robin Envoy; medians over rounds, added latency the median of the "
                 "per-round differences. Cores = gateway Envoy CPU seconds (/proc) over the client's sending time.\n")
        L.append("| figure | warmroute (this bench) | no-filter Envoy (same rounds) | llm-d EPP (published) |"
                 "\n|---|---|---|---|")
        w, n, x = f["median"]["warmroute"], f["median"]["nofilter"], f["external"]
        L.append(f"| pods / rate | {f['pods']} / {w['rps']:.0f} req/s | {f['pods']} / {n['rps']:.0f} req/s | "
                 f"{x['pods']} / ~{x['rps']} req/s |")
        L.append(f"| prompts | 4k and 100k tokens, shared prefixes | same | {x['prompt_tokens']} |")
        L.append(f"| cores at that rate | {w['cores']:.3f} (the filter's share {f['filter_cores']:.3f}) | "
                 f"{n['cores']:.3f} | {x['cores']} |")
        L.append(f"| cores idle | {f['idle_cores']['warmroute']:.3f} | {f['idle_cores']['nofilter']:.3f} | "
                 f"{x['idle_cores']} |")
        L.append(f"| latency | added p50 {f['added_p50_ms'] * 1000:.0f} us, p99 {f['added_p99_ms'] * 1000:.0f} us | "
                 f"p50 {n['p50_ms'] * 1000:.0f} us, p99 {n['p99_ms'] * 1000:.0f} us | scheduler P50 "
                 f"{x['scheduler_p50_ms']} ms (the picker alone, not the gateway's hop) |")
        rss = f["rss_kb"]
        L.append(f"| memory | Envoy RSS {rss['warmroute'][0] / 1024:.0f} MB after warm-up, +"
                 f"{f['memory']['rss_growth_kb']['warmroute'] / 1024:.1f} MB over the rounds (index full: see the "
                 f"workers table) | {rss['nofilter'][0] / 1024:.0f} MB, +{f['memory']['rss_growth_kb']['nofilter'] / 1024:.1f}"
                 " MB | |")
        L.append(f"\nSource of the published figures: {x['source']}. Client: up to "
                 f"{max(r['client_cpu_util'] for rs in f['runs'].values() for r in rs):.2f} of a core; slowest "
                 f"round {f['achieved_rps']:.1f} req/s. Filter: "
                 + ", ".join(f"{k.removeprefix('warmroute.')}={v}" for k, v in f.get("routed", {}).items()) + ".\n")
        L.append("| round | gateway | req/s | cores | CPU us/req | p50 us | p99 us | client CPU | errors |"
                 "\n|---|---|---|---|---|---|---|---|---|")
        for g, rs in f["runs"].items():
            for i, r in enumerate(rs):
                L.append(f"| {i} | {g} | {r['rps']:.1f} | {r['cores']:.3f} | {r['cpu_us_per_req']:.0f} | "
                         f"{r['p50_ms'] * 1000:.0f} | {r['p99_ms'] * 1000:.0f} | {r['client_cpu_util']:.2f} | "
                         f"{r['errors']} |")
        L.append("")
    wk = fl.get("workers")
    if wk:
        L.append(f"## Worker scaling: the same traffic at --concurrency {', '.join(map(str, CONCURRENCIES))}\n")
        L.append(f"{wk['requests']} requests ({wk['seconds']:.0f} s of the fleet traffic) through each gateway at each "
                 f"concurrency, one run each; then {wk['fill_requests']} distinct {wk['fill_words']}-word prompts "
                 f"(about twice the default index.max_blocks) fill warmroute's index. RSS per worker = Envoy's RSS "
                 f"growth from before the traffic / workers (each worker's VM holds an index replica).\n")
        L.append("| workers | gateway | CPU us/req | ratio to 1 worker | RSS growth per worker, traffic (kB) | "
                 "after the fill (kB) | log_gaps | errors |\n|---|---|---|---|---|---|---|---|")
        for r in wk["rows"]:
            filled = f"{r['filled_kb_per_worker']:.0f}" if r["gateway"] != "nofilter" else ""
            L.append(f"| {r['concurrency']} | {r['gateway']} | {r['cpu_us_per_req']:.0f} | {r['cpu_ratio_vs_1']:.2f} | "
                     f"{r['rss_growth_kb_per_worker']:.0f} | {filled} | {r['log_gaps']} | {r['errors']} |")
        L.append("")
    return L
