"""`make bench`: routing quality on real traces and the cost of the filter, through the real Envoy.

    cd bench && ../.venv/bin/python run.py [--quick] [--only SECTION ...]

Sections (all by default): agent conversation chat uniform (routing quality, 3 replicas,
every router + the single-replica reference), scale8 (8 replicas), gateways (3 Envoys in
front of one fleet), reruns (the pairs behind the targets nearest their limits, twice more:
those targets are medians of three paired runs), overhead (filter cost vs no filter, instant
backend), memory (100k distinct prefixes), decision (native decision-time curve, bench/decision).
A full run takes about 22 minutes on 2 cores.

Writes bench/results/latest.json, latest.md, latest.png. Every server binds 127.0.0.1,
every load run is bounded by --max-requests/--max-seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import median

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "e2e"))

import yaml  # noqa: E402

from fleet import LOADGEN_BIN, Envoy, Fleet, Sim, envoy_binary, free_port, wait_http  # noqa: E402

RESULTS = HERE / "results"
DECISION_DIR = HERE / "decision"
DECISION_BIN = ROOT / "target" / "bench-decision" / "release" / "warmroute-decision-bench"
FLOOR_DIR = HERE / "floor-filter"
FLOOR_WASM = ROOT / "target" / "bench-floor" / "wasm32-wasip1" / "release" / "floor.wasm"
CLK_TCK = os.sysconf("SC_CLK_TCK")

# ------------------------------------------------------------------ workloads
#
# Time: the sims run TIME_SCALE x faster than an H100-class replica (sim defaults:
# 12 ms step, 0.06 ms per prefilled token, 0.15 ms per running sequence). Every
# wall-clock parameter of the client (think/tool time, arrival rates, trace speed-up)
# is scaled by the same factor, so queueing and cache behaviour are those of a real
# fleet at real speed, just compressed in time. Lengths are NOT scaled.
TIME_SCALE = 10.0


def sim_args(capacity: int, scale: float = TIME_SCALE) -> list[str]:
    return ["--time-scale", str(scale), "--kv-capacity-tokens", str(capacity)]


# name -> (loadgen args (full run), loadgen args (quick), KV capacity per replica, why)
WORKLOADS: dict[str, dict] = {
    "agent": {
        "args": ["agent", "--agents", "12", "--steps", "12", "--system-tokens", "6000", "--task-tokens", "300",
                 "--output-tokens", "100", "--tool-median", "3000", "--tool-sigma", "1.0", "--tool-max", "16000",
                 "--tool-ms", str(2000 / TIME_SCALE), "--stagger-ms", str(500 / TIME_SCALE)],
        "quick": ["agent", "--agents", "9", "--steps", "8", "--system-tokens", "6000", "--task-tokens", "300",
                  "--output-tokens", "100", "--tool-median", "3000", "--tool-sigma", "1.0", "--tool-max", "16000",
                  "--tool-ms", str(2000 / TIME_SCALE), "--stagger-ms", str(500 / TIME_SCALE)],
        "capacity": 300_000,
        "quick_capacity": 150_000,
        "why": "coding/tool agents: 6k-token system prompt + tool schemas shared by all; each step appends a "
               "tool output (log-normal, median 3k tokens, sigma 1, cap 16k: file reads, test logs) and a "
               "100-token tool call; contexts reach 40-70k tokens by step 12. 2 s mean tool time. "
               "12 agents' final contexts (~700k tokens) exceed one replica (300k, an 8B model's KV on "
               "one 80 GB GPU is ~450k) but fit the fleet (900k).",
    },
    "conversation": {
        "args": ["conversation", "--limit", "800", "--speedup", str(TIME_SCALE), "--length-scale", "1.0",
                 "--max-output", "1024"],
        "quick": ["conversation", "--limit", "300", "--speedup", str(TIME_SCALE), "--length-scale", "1.0",
                  "--max-output", "1024"],
        "capacity": 2_000_000,
        "quick_capacity": 2_000_000,
        "why": "Mooncake conversation trace at its real rate (3.4 req/s, mean 12k input tokens, 512-token "
               "blocks) and real lengths; first 800 lines (267 s of trace). Its reuse distances are millions "
               "of tokens: a block-LRU over these lines (below) hits 3.6% at 400k tokens (one GPU's HBM), "
               "7.7% at 2M, 18.1% at 6M, 19.1% unbounded. So each replica gets 2M tokens (HBM + a host-DRAM "
               "KV tier, as Mooncake itself serves this trace): the working set (~6-9M) exceeds one replica "
               "and roughly fits the fleet (6M). A 400k-per-replica run (rows with KV cap 400000) is kept "
               "as the single-GPU-HBM case.",
    },
    "chat": {
        "args": ["chat", "--sessions", "60", "--turns", "6", "--rate", str(1.0 * TIME_SCALE),
                 "--think-ms", str(15000 / TIME_SCALE), "--system-tokens", "1000", "--user-tokens", "200",
                 "--output-tokens", "250"],
        "quick": ["chat", "--sessions", "30", "--turns", "4", "--rate", str(1.0 * TIME_SCALE),
                  "--think-ms", str(15000 / TIME_SCALE), "--system-tokens", "1000", "--user-tokens", "200",
                  "--output-tokens", "250"],
        "capacity": 60_000,
        "quick_capacity": 40_000,
        "why": "chat assistant: 1k-token system prompt, user turns median 200 tokens, 250-token replies, "
               "15 s mean think time, 1 new session/s, 6 turns; ~100 live sessions x ~2-4k tokens "
               "(~150k+) exceed one replica (60k: a 70B model's KV on a busy replica) but fit 3.",
    },
    "uniform": {
        "args": ["uniform", "--requests", "300", "--rate", str(3.0 * TIME_SCALE), "--prompt-tokens", "2000",
                 "--output-tokens", "200", "--api", "chat"],
        "quick": ["uniform", "--requests", "150", "--rate", str(3.0 * TIME_SCALE), "--prompt-tokens", "2000",
                  "--output-tokens", "200", "--api", "chat"],
        "capacity": 150_000,
        "quick_capacity": 150_000,
        "why": "control: independent 2k-token prompts, 200-token outputs, Poisson 3 req/s (~60% of the "
               "fleet's decode capacity); nothing to reuse, so a cache-aware router must degrade to load "
               "balancing and not lose to least-request.",
    },
}

# The filter's scrape period, timeout and staleness are wall-clock parameters too: at the
# defaults (500/400/2000 ms) a scraped load would be 5 s of modelled time old, far staler
# than on a real fleet, so they are compressed by TIME_SCALE like the client's times.
SCALED_METRICS = {"period_ms": round(500 / TIME_SCALE), "timeout_ms": round(400 / TIME_SCALE),
                  "stale_after_ms": round(2000 / TIME_SCALE)}

ROUTERS = {
    "envoy_round_robin": {"with_filter": False, "lb": "round_robin"},
    "envoy_least_request": {"with_filter": False, "lb": "least_request"},
    **{f"warmroute_{s}": {"filter_overrides": {"strategy": s, "metrics": SCALED_METRICS}}
       for s in ["cache_aware", "prefix_hash", "least_request", "round_robin", "random", "sticky_session"]},
}
QUICK_ROUTERS = ["envoy_round_robin", "envoy_least_request", "warmroute_cache_aware"]


# The pairs behind the targets nearest their limits, re-run by the `reruns` section.
RERUN_PAIRS = [("conversation", "envoy_round_robin", 1), ("conversation", "warmroute_cache_aware", 1),
               ("uniform", "envoy_least_request", 1), ("uniform", "warmroute_cache_aware", 1),
               ("agent", "warmroute_cache_aware", 1), ("agent", "warmroute_cache_aware", 3),
               ("conversation", "warmroute_cache_aware", 3),
               ("chat", "warmroute_cache_aware", 1), ("chat", "warmroute_cache_aware", 3)]
RERUNS = 2


# ------------------------------------------------------------------ helpers

def proc_cpu_s(pid: int) -> float:
    """utime + stime of a process (its threads included) from /proc/<pid>/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def proc_rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def loadgen(args: list[str], targets: list[str], backends: list[str], out: Path, max_seconds: float,
            extra: list[str] | None = None) -> dict:
    cmd = [str(LOADGEN_BIN), *args, "--json", str(out), "--quiet", "--max-seconds", str(max_seconds),
           "--timeout-s", str(max_seconds)]
    for t in targets:
        cmd += ["--target", t]
    for b in backends:
        cmd += ["--backend", b]
    cmd += extra or []
    subprocess.run(cmd, check=True, timeout=max_seconds + 60)
    return json.loads(out.read_text())


def decisions(envoys: list[Envoy]) -> dict[str, int]:
    out: dict[str, int] = {}
    for i, e in enumerate(envoys):
        # The filter adds to its counters at each tick: wait for one, once for all gateways.
        for k, v in (e.stats() if i else e.settled_stats()).items():
            if k.startswith("wasmcustom.warmroute.decision."):
                try:
                    out[k.removeprefix("wasmcustom.warmroute.decision.")] = \
                        out.get(k.removeprefix("wasmcustom.warmroute.decision."), 0) + int(v)
                except ValueError:
                    pass
    return {k: v for k, v in sorted(out.items()) if v}


def row_from(report: dict, **meta) -> dict:
    keep = ["hit_rate", "usage_hit_rate", "ttft_ms", "e2e_ms", "step_ms", "runtime_s", "errors", "aborted",
            "skipped", "requests", "ok", "share", "per_target", "client_cpu_s", "client_cpu_util",
            "throughput_rps", "error_samples"]
    return {**meta, **{k: report.get(k) for k in keep}}


# ------------------------------------------------------------------ routing quality

class Bench:
    def __init__(self, quick: bool, logdir: Path):
        self.quick = quick
        self.logdir = logdir
        self.rows: list[dict] = []
        # Rows of the target re-runs, one list per re-run (see `reruns`).
        self.reruns: list[list[dict]] = []
        self.extra: dict = {}
        self.n = 0

    def wl(self, name: str, scale_agents: float = 1.0) -> tuple[list[str], int]:
        w = WORKLOADS[name]
        args = list(w["quick" if self.quick else "args"])
        cap = w["quick_capacity" if self.quick else "capacity"]
        return args, cap

    def quality(self, workload: str, router: str, replicas: int = 3, gateways: int = 1,
                args: list[str] | None = None, capacity: int | None = None, scale: float = TIME_SCALE,
                label: str | None = None, rerun: int = 0) -> dict:
        base_args, base_cap = self.wl(workload)
        args = args or base_args
        capacity = capacity or base_cap
        self.n += 1
        rdir = self.logdir / f"{self.n:02d}-{workload}-{label or router}-{replicas}r-{gateways}g"
        rdir.mkdir(parents=True)
        kwargs = dict(ROUTERS[router]) if router in ROUTERS else {"with_filter": False, "lb": "round_robin"}
        max_s = 60.0 if self.quick else 150.0
        t0 = time.time()
        with Fleet(replicas, sim_args(capacity, scale), gateways=gateways, logdir=rdir, **kwargs) as f:
            cpu0 = [proc_cpu_s(e.proc.pid) for e in f.envoys]
            rep = loadgen(args, [f"http://127.0.0.1:{e.port}" for e in f.envoys],
                          [f"http://{s.address}" for s in f.sims], rdir / "report.json", max_s,
                          ["--records", str(rdir / "records.jsonl")])
            envoy_cpu = sum(proc_cpu_s(e.proc.pid) for e in f.envoys) - sum(cpu0)
            dec = decisions(f.envoys) if kwargs.get("with_filter", True) else {}
        row = row_from(rep, workload=workload, router=label or router, replicas=replicas, gateways=gateways,
                       kv_capacity_tokens=capacity, time_scale=scale, envoy_cpu_s=round(envoy_cpu, 2),
                       decisions=dec)
        if rerun:
            row["rerun"] = rerun
            self.reruns[rerun - 1].append(row)
        else:
            self.rows.append(row)
        hr = row["hit_rate"]
        print(f"  {workload:12s} {row['router']:28s} {replicas}r {gateways}g  hit {hr if hr is None else round(hr, 3)}"
              f"  ttft p95 {(row['ttft_ms'] or {}).get('p95', 0):8.0f}  e2e mean {(row['e2e_ms'] or {}).get('mean', 0):8.0f}"
              f"  err {row['errors']}  client cpu {row['client_cpu_util']:.2f}  ({time.time() - t0:.0f}s)", flush=True)
        return row

    def reference(self, workload: str) -> dict:
        """One replica with the fleet's total KV capacity (and compute: 3x time scale)."""
        _, cap = self.wl(workload)
        return self.quality(workload, "reference", replicas=1, capacity=3 * cap, scale=3 * TIME_SCALE,
                            label="reference_1_replica_3x")

    def workload_section(self, workload: str) -> None:
        print(f"== {workload}", flush=True)
        routers = QUICK_ROUTERS if self.quick else list(ROUTERS)
        if workload == "chat" and self.quick:
            routers = routers + ["warmroute_sticky_session"]
        self.reference(workload)
        for r in routers:
            self.quality(workload, r)

    def scale8(self) -> None:
        print("== 8 replicas", flush=True)
        for workload in (["agent"] if self.quick else ["agent", "conversation"]):
            args, cap = self.wl(workload)
            args = list(args)
            if workload == "agent":  # 8/3 the agents: same load per replica
                i = args.index("--agents")
                args[i + 1] = str(round(int(args[i + 1]) * 8 / 3))
            else:  # trace replayed 8/3 faster than real time: same load per replica
                i = args.index("--speedup")
                args[i + 1] = str(float(args[i + 1]) * 8 / 3)
                j = args.index("--limit")
                args[j + 1] = str(round(int(args[j + 1]) * 8 / 3))
            for r in ["envoy_round_robin", "envoy_least_request", "warmroute_cache_aware"]:
                self.quality(workload, r, replicas=8, args=args, capacity=cap)

    def gateways(self) -> None:
        print("== 3 gateways", flush=True)
        for workload in (["agent"] if self.quick else ["agent", "conversation", "chat"]):
            self.quality(workload, "warmroute_cache_aware", gateways=3)

    def reruns_section(self, n: int = RERUNS) -> None:
        """Runs the pairs behind the targets nearest their limits `n` more times.

        One run of a pair scatters by about ±5% on this machine (conversation TTFT P95
        ratio 0.54-0.65x, 3-gateway agent ratio 0.94-1.0x, uniform's worst figure
        1.01-1.06x over one session), as much as the distance to those limits; a
        target is then the median of the pair's ratios over the main run and these."""
        print(f"== target re-runs ({n} more of each pair)", flush=True)
        for i in range(1, n + 1):
            self.reruns.append([])
            for workload, router, gateways in RERUN_PAIRS:
                self.quality(workload, router, gateways=gateways, rerun=i)


# ------------------------------------------------------------------ cost of the filter

SSE_BODY = (
    'data: {"id":"x","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"ok"}}]}\n\n'
    'data: {"id":"x","object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":1,'
    '"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":0}}}\n\n'
    "data: [DONE]\n\n"
)
METRICS_BODY = (
    "vllm:num_requests_running{model_name=\"sim\"} 0\n"
    "vllm:num_requests_waiting{model_name=\"sim\"} 0\n"
    "vllm:kv_cache_usage_perc{model_name=\"sim\"} 0\n"
    "vllm:prefix_cache_hits_total{model_name=\"sim\"} 0\n"
    "vllm:prefix_cache_queries_total{model_name=\"sim\"} 0\n"
)


class InstantBackend:
    """An Envoy answering every request at once (direct_response), after reading the whole body
    (buffer filter), on one port per replica: the same backend for runs with and without the filter."""

    def __init__(self, replicas: int, logdir: Path):
        self.ports = [free_port() for _ in range(replicas)]
        self.admin = free_port()
        self.logdir = logdir
        self.proc: subprocess.Popen | None = None

    def config(self) -> dict:
        listeners = []
        for i, p in enumerate(self.ports):
            listeners.append({
                "name": f"instant-{i}",
                "address": {"socket_address": {"address": "127.0.0.1", "port_value": p}},
                "per_connection_buffer_limit_bytes": 16777216,
                "filter_chains": [{"filters": [{
                    "name": "envoy.filters.network.http_connection_manager",
                    "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                        "stat_prefix": f"instant{i}",
                        "route_config": {"virtual_hosts": [{"name": "all", "domains": ["*"], "routes": [
                            {"match": {"prefix": "/metrics"},
                             "direct_response": {"status": 200, "body": {"inline_string": METRICS_BODY}}},
                            {"match": {"prefix": "/"},
                             "direct_response": {"status": 200, "body": {"inline_string": SSE_BODY}},
                             "response_headers_to_add": [
                                 {"header": {"key": "content-type", "value": "text/event-stream"},
                                  "append_action": "OVERWRITE_IF_EXISTS_OR_ADD"},
                                 {"header": {"key": "x-sim-replica", "value": f"sim-{i}"},
                                  "append_action": "OVERWRITE_IF_EXISTS_OR_ADD"}]},
                        ]}]},
                        "http_filters": [
                            {"name": "envoy.filters.http.buffer", "typed_config": {
                                "@type": "type.googleapis.com/envoy.extensions.filters.http.buffer.v3.Buffer",
                                "max_request_bytes": 4194304}},
                            {"name": "envoy.filters.http.router", "typed_config": {
                                "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}},
                        ],
                    }}]}],
            })
        return {"admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": self.admin}}},
                "static_resources": {"listeners": listeners}}

    def __enter__(self) -> "InstantBackend":
        path = self.logdir / "instant.yaml"
        path.write_text(yaml.safe_dump(self.config(), sort_keys=False))
        self.proc = subprocess.Popen(
            [envoy_binary(), "-c", str(path), "--concurrency", "1", "--base-id", str(self.admin),
             "-l", "warning", "--disable-hot-restart"],
            stdout=open(self.logdir / "instant.log", "wb"), stderr=subprocess.STDOUT)
        wait_http(self.admin, "/ready", timeout=30, proc=self.proc)
        return self

    def __exit__(self, *exc) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)

    def sims(self) -> list[Sim]:
        return [Sim(f"sim-{i}", p) for i, p in enumerate(self.ports)]


def uniform_args(words: int, requests: int, seed: int) -> list[str]:
    return ["uniform", "--api", "chat", "--prompt-tokens", str(words), "--output-tokens", "1",
            "--requests", str(requests), "--rate", "1000000", "--seed", str(seed)]


PHASES_WASM = ROOT / "target" / "bench-phases" / "wasm32-wasip1" / "release" / "warmroute.wasm"
PHASES_LINE = re.compile(r"warmroute phases: n=(\d+) body_ns=(\d+) parse_ns=(\d+) route_ns=(\d+) header_ns=(\d+)")


def build_phases_filter() -> Path:
    """warmroute built with `phase-timing`: it logs where a request's time goes inside the VM."""
    subprocess.run(["cargo", "build", "--release", "-q", "--target", "wasm32-wasip1", "-p", "warmroute-filter",
                    "--features", "phase-timing", "--target-dir", str(ROOT / "target" / "bench-phases")],
                   check=True, timeout=900, cwd=ROOT)
    return PHASES_WASM


def phase_breakdown(log: Path) -> dict:
    """Mean µs per phase over every `warmroute phases` line an Envoy log holds."""
    lines = [tuple(map(int, m.groups())) for m in PHASES_LINE.finditer(log.read_text(errors="replace"))]
    n = sum(x[0] for x in lines)
    names = ["body", "parse", "route", "header"]
    return {"requests": n, **{f"{k}_us": sum(x[0] * x[i + 1] for x in lines) / max(n, 1) / 1000
                              for i, k in enumerate(names)}}


def build_floor_filter() -> Path:
    subprocess.run(["cargo", "build", "--release", "-q", "--target", "wasm32-wasip1",
                    "--manifest-path", str(FLOOR_DIR / "Cargo.toml"),
                    "--target-dir", str(ROOT / "target" / "bench-floor")], check=True, timeout=900)
    return FLOOR_WASM


# The gateways of the overhead section: no filter, the floor any body-routing Wasm filter pays
# (bench/floor-filter), and warmroute.
GATEWAYS = ("nofilter", "floor", "warmroute")


def overhead(b: Bench) -> dict:
    """Added latency, max throughput and CPU per request, with vs without the filter.

    The gateways (same Envoy binary and config: no filter, the floor filter, warmroute) run side
    by side in front of the same instant backend, and the measurement alternates between them in
    rounds (ABC, CBA, ...): this machine's speed drifts by 2x over minutes (shared cores), so
    sequential phases measure the drift as much as the filter. Added latency is the median over
    rounds of the paired per-round p50/p99 differences. The floor filter holds the headers,
    buffers the body, reads it into the VM and writes the routing header, nothing else: what
    Envoy charges any filter that routes on the body, which warmroute cannot go below."""
    print("== cost of the filter", flush=True)
    floor_wasm = build_floor_filter()
    phases_wasm = build_phases_filter()
    rdir = b.logdir / "overhead"
    rdir.mkdir()
    # 1 KB and 128 KB chat bodies (pseudo-words are ~8.5 bytes with JSON overhead).
    sizes = {"1KB": 110, "128KB": 15000}
    rounds = 4 if b.quick else 8
    out: dict = {"runs": [], "rounds": rounds}
    lat_n = {"1KB": 600 if b.quick else 3000, "128KB": 200 if b.quick else 1000}
    thr_n = {"1KB": 1500 if b.quick else 8000, "128KB": 300 if b.quick else 1500}
    # Production settings: the debug response header is a troubleshooting aid, off by default.
    filter_cfg = {"strategy": "cache_aware", "debug_header": False}
    with InstantBackend(3, rdir) as be:
        # Client floor: straight to the backend (no gateway) — what the client itself adds.
        floor = loadgen(uniform_args(110, lat_n["1KB"], 7), [f"http://127.0.0.1:{be.ports[0]}"], [],
                        rdir / "floor.json", 120, ["--concurrency", "1"])
        out["client_floor_1KB"] = {"e2e_ms": floor["e2e_ms"], "client_cpu_util": floor["client_cpu_util"]}
        out["compare"] = []
        for workers in (1, 2):
            for size, words in sizes.items():
                gw = {"nofilter": Envoy(be.sims(), concurrency=workers, with_filter=False, lb="round_robin"),
                      "floor": Envoy(be.sims(), concurrency=workers, filter_overrides=filter_cfg,
                                     wasm_file=floor_wasm),
                      "warmroute": Envoy(be.sims(), concurrency=workers, filter_overrides=filter_cfg)}
                for e in gw.values():
                    e.start(rdir)
                per: dict = {g: {"p50": [], "p99": [], "mean": [], "cpu_seq": [], "rps": [], "cpu_load": [],
                                 "errors": 0} for g in gw}
                try:
                    for g, e in gw.items():  # warm-up (connections, VM, index)
                        loadgen(uniform_args(words, 50, 99), [f"http://127.0.0.1:{e.port}"], [],
                                rdir / f"{size}-{workers}w-{g}-warm.json", 60, ["--concurrency", "1"])
                    for r in range(rounds):
                        for g in (GATEWAYS if r % 2 == 0 else GATEWAYS[::-1]):
                            e, m = gw[g], per[g]
                            tag = f"{size}-{workers}w-{g}-r{r}"
                            target = [f"http://127.0.0.1:{e.port}"]
                            c0 = proc_cpu_s(e.proc.pid)
                            lat = loadgen(uniform_args(words, lat_n[size] // rounds, 1 + r), target, [],
                                          rdir / f"{tag}-lat.json", 120, ["--concurrency", "1"])
                            c1 = proc_cpu_s(e.proc.pid)
                            thr = loadgen(uniform_args(words, thr_n[size] // rounds, 100 + r), target, [],
                                          rdir / f"{tag}-thr.json", 120, ["--concurrency", "32", "--threads", "1"])
                            c2 = proc_cpu_s(e.proc.pid)
                            m["p50"].append(lat["e2e_ms"]["p50"])
                            m["p99"].append(lat["e2e_ms"]["p99"])
                            m["mean"].append(lat["e2e_ms"]["mean"])
                            m["cpu_seq"].append((c1 - c0) / max(lat["ok"], 1) * 1e6)
                            m["rps"].append(thr["throughput_rps"])
                            m["cpu_load"].append((c2 - c1) / max(thr["ok"], 1) * 1e6)
                            m["errors"] += lat["errors"] + thr["errors"]
                finally:
                    for e in gw.values():
                        e.stop()
                for g, m in per.items():
                    run = {"size": size, "workers": workers, "gateway": g,
                           "p50_ms": median(m["p50"]), "p99_ms": median(m["p99"]), "mean_ms": median(m["mean"]),
                           "cpu_us_per_req_seq": median(m["cpu_seq"]), "max_rps": median(m["rps"]),
                           "cpu_us_per_req_load": median(m["cpu_load"]), "errors": m["errors"],
                           "p50_ms_rounds": m["p50"]}
                    out["runs"].append(run)
                    print(f"  {size}-{workers}w-{g:9s} p50 {run['p50_ms'] * 1000:7.0f} us  "
                          f"p99 {run['p99_ms'] * 1000:7.0f} us  max {run['max_rps']:7.0f} rps  "
                          f"cpu/req {run['cpu_us_per_req_load']:6.0f} us  err {run['errors']}", flush=True)

                def paired(x: str, y: str, k: str) -> list[float]:
                    return [(b_ - a_) * 1000 for a_, b_ in zip(per[x][k], per[y][k])]

                def ratio(x: str, y: str, k: str) -> float:
                    return median([b_ / max(a_, 1e-9) for a_, b_ in zip(per[x][k], per[y][k])])

                added = paired("nofilter", "warmroute", "p50")
                out["compare"].append({
                    "size": size, "workers": workers,
                    "added_p50_us": median(added),
                    "added_p99_us": median(paired("nofilter", "warmroute", "p99")),
                    "added_p50_us_rounds": added,
                    "floor_added_p50_us": median(paired("nofilter", "floor", "p50")),
                    "floor_added_p99_us": median(paired("nofilter", "floor", "p99")),
                    "over_floor_p50_us": median(paired("floor", "warmroute", "p50")),
                    "throughput_ratio": ratio("nofilter", "warmroute", "rps"),
                    "cpu_per_req_ratio": ratio("nofilter", "warmroute", "cpu_load"),
                    "floor_cpu_per_req_ratio": ratio("nofilter", "floor", "cpu_load"),
                    "cpu_us_per_req_filter": median(per["warmroute"]["cpu_load"]),
                    "cpu_us_per_req_floor": median(per["floor"]["cpu_load"]),
                    "cpu_us_per_req_nofilter": median(per["nofilter"]["cpu_load"]),
                })
                c = out["compare"][-1]
                # Where warmroute's time goes inside the VM: a separate pass through the build that
                # times its phases with the host clock (each lap is a host call, so never in the rounds).
                pe = Envoy(be.sims(), concurrency=workers, filter_overrides=filter_cfg, wasm_file=phases_wasm)
                pe.start(rdir)
                try:
                    loadgen(uniform_args(words, lat_n[size] // 4, 55), [f"http://127.0.0.1:{pe.port}"], [],
                            rdir / f"{size}-{workers}w-phases.json", 120, ["--concurrency", "1"])
                finally:
                    pe.stop()
                c["phases"] = phase_breakdown(rdir / f"envoy-{pe.port}.log")
                print(f"  {size}-{workers}w inside the VM (mean over {c['phases']['requests']} requests): "
                      + ", ".join(f"{k} {c['phases'][f'{k}_us']:.0f} us" for k in ("body", "parse", "route", "header")),
                      flush=True)
                print(f"  {size}-{workers}w added p50 {c['added_p50_us']:.0f} us (rounds: "
                      f"{', '.join(f'{x:.0f}' for x in added)}); floor {c['floor_added_p50_us']:.0f} us, "
                      f"warmroute over floor {c['over_floor_p50_us']:.0f} us; CPU/req x{c['cpu_per_req_ratio']:.2f} "
                      f"(floor x{c['floor_cpu_per_req_ratio']:.2f})", flush=True)
    return out


def memory(b: Bench) -> dict:
    """Envoy memory before/after N distinct-prefix requests through the filter."""
    n = 10_000 if b.quick else 100_000
    print(f"== memory after {n} distinct prefixes", flush=True)
    rdir = b.logdir / "memory"
    rdir.mkdir()
    with InstantBackend(3, rdir) as be:
        e = Envoy(be.sims(), concurrency=2, filter_overrides={"strategy": "cache_aware"})
        e.start(rdir)
        try:
            target = [f"http://127.0.0.1:{e.port}"]
            loadgen(uniform_args(110, 200, 5), target, [], rdir / "warm.json", 60, ["--concurrency", "4"])
            time.sleep(1)
            before = envoy_memory(e)
            rep = loadgen(uniform_args(110, n, 6), target, [], rdir / "fill.json", 400, ["--concurrency", "32"])
            time.sleep(1)
            after = envoy_memory(e)
        finally:
            e.stop()
    delta = {k: after[k] - before[k] for k in before if isinstance(before[k], (int, float)) and k in after}
    print(f"  {rep['ok']} ok, {rep['errors']} errors; RSS {before['rss_kb']} -> {after['rss_kb']} kB; "
          f"delta {json.dumps(delta)}", flush=True)
    return {"prefixes": n, "ok": rep["ok"], "errors": rep["errors"], "before": before, "after": after,
            "delta": delta}


def envoy_memory(e: Envoy) -> dict:
    import http.client
    out: dict = {"rss_kb": proc_rss_kb(e.proc.pid)}
    c = http.client.HTTPConnection("127.0.0.1", e.admin_port, timeout=5)
    c.request("GET", "/memory")
    mem = json.loads(c.getresponse().read())
    for k in ("allocated", "heap_size", "pageheap_unmapped", "pageheap_free", "total_thread_cache"):
        if k in mem:
            out[f"heap_{k}"] = int(mem[k])
    for k, v in e.settled_stats().items():
        if ("wasm" in k and ("memory" in k or "active" in k or "created" in k)) or k.startswith("wasmcustom.warmroute.index"):
            try:
                out[k] = int(v)
            except ValueError:
                pass
    return out


def decision_curve(b: Bench) -> list[dict]:
    print("== decision time (native)", flush=True)
    subprocess.run(["cargo", "build", "--release", "-q", "--manifest-path", str(DECISION_DIR / "Cargo.toml"),
                    "--target-dir", str(ROOT / "target" / "bench-decision")], check=True, timeout=900)
    p = subprocess.run([str(DECISION_BIN), *(["--quick"] if b.quick else [])], check=True, capture_output=True,
                       text=True, timeout=300)
    rows = [json.loads(l) for l in p.stdout.splitlines() if l.strip()]
    for r in rows:
        print(f"  {r['axis']:8s} backends {r['backends']:4d} prompt {r['prompt_tokens']:7d} tok "
              f"({r['body_bytes'] / 1024:6.0f} KB): parse {r['parse_us']:7.1f} us  route {r['route_us']:7.1f} us")
    return rows


# ------------------------------------------------------------------ trace analysis (why the capacity)

def lru_hit_rate(capacity_tokens: int, limit: int) -> float:
    """Block-level LRU prefix-cache hit rate of one cache over the first `limit` trace lines."""
    from collections import OrderedDict
    trace = ROOT.parent / "shared" / "traces" / "conversation_trace.jsonl"
    cap = max(1, capacity_tokens // 512)
    lru: OrderedDict = OrderedDict()
    hits = total = 0
    with open(trace) as fh:
        for i, line in enumerate(fh):
            if i >= limit:
                break
            ids = json.loads(line)["hash_ids"]
            matched = True
            for h in ids:
                total += 1
                if matched and h in lru:
                    hits += 1
                else:
                    matched = False
            for h in ids:
                lru[h] = True
                lru.move_to_end(h)
            while len(lru) > cap:
                lru.popitem(last=False)
    return hits / max(total, 1)


# ------------------------------------------------------------------ targets, report

def find(rows, workload, router, replicas=3, gateways=1, quick=False):
    """The row of the workload's configured KV capacity (3x for the single-replica reference)."""
    w = WORKLOADS.get(workload, {})
    cap = w.get("quick_capacity" if quick else "capacity")
    if router.startswith("reference") and cap:
        cap *= 3
    found = None
    for r in rows:
        if r["workload"] == workload and r["router"] == router and r["replicas"] == replicas and r["gateways"] == gateways:
            if r.get("kv_capacity_tokens") == cap:
                return r
            found = found or r
    return found


def row_key(r: dict) -> tuple:
    return (r["workload"], r["router"], r["replicas"], r["gateways"], r.get("kv_capacity_tokens"))


def g(r, *path):
    v = r
    for p in path:
        if v is None:
            return None
        v = v.get(p)
    return v


def targets(rows: list[dict], ov: dict | None, reruns: list[list[dict]] | None = None) -> list[dict]:
    out = []

    def check(name, measured, limit, ok):
        out.append({"target": name, "measured": measured, "limit": limit,
                    "result": "n/a" if ok is None else ("PASS" if ok else "FAIL")})

    def over_runs(fn):
        """fn(rows) -> (ratio, detail) or None, over the main run and each re-run of its pair:
        the median ratio, and a note of every run's (the main run's detail first)."""
        runs = [r for r in [fn(rows)] + [fn(rr) for rr in (reruns or [])] if r is not None]
        if not runs:
            return None
        m = median([v for v, _ in runs])
        if len(runs) == 1:
            return m, f"{m:.3f}x ({runs[0][1]})"
        each = ", ".join(f"{v:.3f}" for v, _ in runs)
        return m, f"{m:.3f}x median of {len(runs)} paired runs ({each}); first run {runs[0][1]}"

    ca, rr, ref = (find(rows, "agent", "warmroute_cache_aware"), find(rows, "agent", "envoy_round_robin"),
                   find(rows, "agent", "reference_1_replica_3x", replicas=1))
    if ca and rr and ref:
        hr = (ca["hit_rate"] or 0) / max(ref["hit_rate"] or 1e-9, 1e-9)
        check("agent: cache_aware hit rate >= 0.9x single-replica reference", f"{hr:.2f}x ({ca['hit_rate']:.3f} vs {ref['hit_rate']:.3f})", ">= 0.90x", hr >= 0.9)
        m = g(ca, "step_ms", "mean") / g(rr, "step_ms", "mean")
        p = g(ca, "step_ms", "p95") / g(rr, "step_ms", "p95")
        check("agent: mean step latency <= 0.6x Envoy round robin", f"{m:.2f}x ({g(ca, 'step_ms', 'mean'):.0f} vs {g(rr, 'step_ms', 'mean'):.0f} ms)", "<= 0.60x", m <= 0.6)
        check("agent: P95 step latency <= 0.4x Envoy round robin", f"{p:.2f}x ({g(ca, 'step_ms', 'p95'):.0f} vs {g(rr, 'step_ms', 'p95'):.0f} ms)", "<= 0.40x", p <= 0.4)
    def conversation_p95(rs):
        ca, rr = find(rs, "conversation", "warmroute_cache_aware"), find(rs, "conversation", "envoy_round_robin")
        if ca and rr:
            return (g(ca, "ttft_ms", "p95") / g(rr, "ttft_ms", "p95"),
                    f"{g(ca, 'ttft_ms', 'p95'):.0f} vs {g(rr, 'ttft_ms', 'p95'):.0f} ms")
        return None

    r = over_runs(conversation_p95)
    if r:
        check("conversation: cache_aware TTFT P95 <= 0.6x round robin", r[1], "<= 0.60x", r[0] <= 0.6)

    def uniform_worst(rs):
        ca, lr = find(rs, "uniform", "warmroute_cache_aware"), find(rs, "uniform", "envoy_least_request")
        if not (ca and lr):
            return None
        worst = []
        for path in [("ttft_ms", "mean"), ("ttft_ms", "p50"), ("ttft_ms", "p95"), ("ttft_ms", "p99"),
                     ("e2e_ms", "mean"), ("e2e_ms", "p95"), ("runtime_s",)]:
            a, b_ = g(ca, *path), g(lr, *path)
            if a is not None and b_:
                worst.append((a / b_, ".".join(path)))
        w = max(worst)
        return w[0], f"worst {w[1]}"

    r = over_runs(uniform_worst)
    if r:
        check("uniform: every figure of cache_aware within 5% of least request (Envoy's)", r[1], "<= 1.05x",
              r[0] <= 1.05)
    for workload in ("agent", "conversation", "chat"):
        def gateway_ratio(rs, workload=workload):
            three = find(rs, workload, "warmroute_cache_aware", gateways=3)
            one = three and next((r for r in rs if r["workload"] == workload and r["router"] == "warmroute_cache_aware"
                                  and r["replicas"] == 3 and r["gateways"] == 1
                                  and r.get("kv_capacity_tokens") == three.get("kv_capacity_tokens")), None)
            if one and three and one["hit_rate"]:
                return (three["hit_rate"] / one["hit_rate"],
                        f"{three['hit_rate']:.3f} vs {one['hit_rate']:.3f}")
            return None

        r = over_runs(gateway_ratio)
        if r:
            check(f"{workload}: 3 gateways hit rate >= 0.95x 1 gateway", r[1], ">= 0.95x", r[0] >= 0.95)
    if ov:
        for c in ov["compare"]:
            lim = 50 if c["size"] == "1KB" else 150
            check(f"filter overhead: added p50, {c['size']} body, {c['workers']} worker(s)",
                  f"{c['added_p50_us']:.0f} us"
                  + f" (floor filter {c['floor_added_p50_us']:.0f} us)",
                  f"<= {lim} us", c["added_p50_us"] <= lim)
    return out


def fmt(v, nd=0):
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{nd}f}"
    return str(v)


def markdown(res: dict) -> str:
    rows, L = res["quality"], []
    L.append(f"# warmroute benchmark ({'quick' if res['quick'] else 'full'} run, {res['started']})\n")
    L.append(f"Machine: {res['machine']}. Real Envoy {res['envoy_version']}, dist/warmroute.wasm, simulated vLLM "
             f"replicas (`warmroute-sim --time-scale {TIME_SCALE:g}`), client `warmroute-loadgen`. "
             f"Total bench wall time {res['wall_s']:.0f} s.\n")
    if res["targets"]:
        L.append("## Targets\n")
        L.append("| target | measured | limit | result |\n|---|---|---|---|")
        for t in res["targets"]:
            L.append(f"| {t['target']} | {t['measured']} | {t['limit']} | **{t['result']}** |")
        L.append("")
    if rows:
        L.append("## Routing quality\n")
        L.append("Hit rate = fleet prefix-cache hit rate from the backends' `vllm:prefix_cache_{hits,queries}_total` "
                 "deltas. Latencies in ms of wall time at time scale 10 (x10 = real-GPU-equivalent ms). "
                 "`step` = agent step latency. `share` = per-backend request share. `cpu` = client CPU utilisation "
                 "(1.0 = one core).\n")
        L.append("| workload | router | repl | gw | KV cap/replica | hit rate | TTFT mean | p50 | p95 | p99 | e2e mean | e2e p95 | "
                 "step mean | step p95 | runtime s | ok | errors | share | client cpu |")
        L.append("|" + "---|" * 19)
        for r in rows:
            share = " / ".join(f"{v * 100:.0f}" for _, v in sorted((r["share"] or {}).items()))
            L.append(f"| {r['workload']} | {r['router']} | {r['replicas']} | {r['gateways']} | "
                     f"{r.get('kv_capacity_tokens')} | {fmt(r['hit_rate'] and r['hit_rate'] * 100, 1)}% | {fmt(g(r, 'ttft_ms', 'mean'))} | "
                     f"{fmt(g(r, 'ttft_ms', 'p50'))} | {fmt(g(r, 'ttft_ms', 'p95'))} | {fmt(g(r, 'ttft_ms', 'p99'))} | "
                     f"{fmt(g(r, 'e2e_ms', 'mean'))} | {fmt(g(r, 'e2e_ms', 'p95'))} | {fmt(g(r, 'step_ms', 'mean'))} | "
                     f"{fmt(g(r, 'step_ms', 'p95'))} | {fmt(r['runtime_s'], 1)} | {r['ok']} | {r['errors']} | "
                     f"{share} | {fmt(r['client_cpu_util'], 2)} |")
        L.append("")
        dec = [r for r in rows if r.get("decisions")]
        if dec:
            L.append("### warmroute decisions (`wasmcustom.warmroute.decision.*`, summed over gateways)\n")
            for r in dec:
                L.append(f"- {r['workload']} / {r['router']} / {r['replicas']}r / {r['gateways']}g: "
                         + ", ".join(f"{k}={v}" for k, v in r["decisions"].items()))
            L.append("")
    reruns = [r for rr in res.get("reruns") or [] for r in rr]
    if reruns:
        L.append("### Target re-runs\n")
        L.append("The pairs behind the targets nearest their limits, run again after the sections above; "
                 "those targets are the median ratio over the main run and these.\n")
        L.append("| re-run | workload | router | gw | hit rate | TTFT mean | TTFT p95 | e2e mean | e2e p95 | runtime s |")
        L.append("|" + "---|" * 10)
        for r in reruns:
            L.append(f"| {r['rerun']} | {r['workload']} | {r['router']} | {r['gateways']} | "
                     f"{fmt(r['hit_rate'] and r['hit_rate'] * 100, 1)}% | {fmt(g(r, 'ttft_ms', 'mean'), 1)} | "
                     f"{fmt(g(r, 'ttft_ms', 'p95'))} | {fmt(g(r, 'e2e_ms', 'mean'))} | {fmt(g(r, 'e2e_ms', 'p95'))} | "
                     f"{fmt(r['runtime_s'], 1)} |")
        L.append("")
    ov = res.get("overhead")
    if ov:
        L.append("## Cost of the filter (same Envoy binary and config, same instant backend, with vs without the wasm filter)\n")
        L.append("Backend: a second Envoy answering every request with a fixed SSE body via `direct_response` after "
                 "buffering the whole request (3 listeners = 3 backends). Latency: 1 request in flight (closed loop); "
                 "max throughput: 32 in flight. CPU/request: gateway Envoy utime+stime from /proc/<pid>/stat over the "
                 "throughput run / requests. The client and both Envoys share the machine's 2 cores, so max throughput "
                 "is a with/without ratio, not an absolute capacity. The gateways with and without the filter run side "
                 f"by side and are measured in {ov.get('rounds', 1)} alternating rounds; each figure is the median over "
                 "rounds, and added latency the median of the per-round differences (this machine's speed drifts). "
                 "A third gateway runs the *floor filter* (`bench/floor-filter`): it holds the headers, buffers "
                 "the body, reads it into the VM and writes the routing header, nothing else. That is what Envoy "
                 "charges any Wasm filter that routes on the body; warmroute's own work is the rest.\n")
        L.append("| body | workers | gateway | p50 us | p99 us | max rps | Envoy CPU us/req | errors |\n|---|---|---|---|---|---|---|---|")
        for r in ov["runs"]:
            L.append(f"| {r['size']} | {r['workers']} | {r['gateway']} | {r['p50_ms'] * 1000:.0f} | "
                     f"{r['p99_ms'] * 1000:.0f} | {r['max_rps']:.0f} | {r['cpu_us_per_req_load']:.0f} | {r['errors']} |")
        L.append("\n| body | workers | warmroute added p50 us | added p99 us | floor added p50 us | warmroute over floor p50 us "
                 "| throughput with/without | CPU/req with/without | floor CPU/req with/without |\n|---|---|---|---|---|---|---|---|---|")
        for c in ov["compare"]:
            L.append(f"| {c['size']} | {c['workers']} | {c['added_p50_us']:.0f} | {c['added_p99_us']:.0f} | "
                     f"{c['floor_added_p50_us']:.0f} | {c['over_floor_p50_us']:.0f} | {c['throughput_ratio']:.2f} | "
                     f"{c['cpu_per_req_ratio']:.2f} | {c['floor_cpu_per_req_ratio']:.2f} |")
        ph = [c for c in ov["compare"] if c.get("phases", {}).get("requests")]
        if ph:
            L.append("\nInside the VM (a separate pass through a build with `--features phase-timing`, which reads "
                     "the host clock between phases; each figure includes about one clock read), mean us per request:\n")
            L.append("| body | workers | read body | parse + hash | route (shared data, index) | write header |"
                     "\n|---|---|---|---|---|---|")
            for c in ph:
                p_ = c["phases"]
                L.append(f"| {c['size']} | {c['workers']} | {p_['body_us']:.0f} | {p_['parse_us']:.0f} | "
                         f"{p_['route_us']:.0f} | {p_['header_us']:.0f} |")
        L.append("\nAdded p50 per round (us): " + "; ".join(
            f"{c['size']} {c['workers']}w: " + ", ".join(f"{x:.0f}" for x in c["added_p50_us_rounds"])
            for c in ov["compare"]) + ".")
        fl = ov["client_floor_1KB"]
        L.append(f"\nClient floor (loadgen straight to the instant backend, 1 KB): p50 {fl['e2e_ms']['p50'] * 1000:.0f} us, "
                 f"p99 {fl['e2e_ms']['p99'] * 1000:.0f} us.\n")
    mem = res.get("memory")
    if mem:
        L.append(f"## Memory after {mem['prefixes']} distinct prefixes ({mem['ok']} ok, {mem['errors']} errors)\n")
        L.append("| figure | before | after | delta |\n|---|---|---|---|")
        for k in mem["before"]:
            if k in mem["after"]:
                L.append(f"| {k} | {mem['before'][k]} | {mem['after'][k]} | {mem['after'][k] - mem['before'][k]} |")
        L.append("")
    dc = res.get("decision")
    if dc:
        L.append("## Decision time (native x86-64 build of the filter's lib; median per request)\n")
        L.append("`parse` = `openai::prompt_key` (JSON parse + block hashing), `route` = `Router::route` + `release` "
                 "on an index warmed with each conversation's previous turn, `MemoryHost` shared data. "
                 "Inside Envoy the same code runs as wasm in V8 (typically 1.5-3x slower) and shared-data calls "
                 "cross the VM boundary.\n")
        L.append("| axis | backends | prompt tokens | body KB | parse us | route us | total us |\n|---|---|---|---|---|---|---|")
        for r in dc:
            L.append(f"| {r['axis']} | {r['backends']} | {r['prompt_tokens']} | {r['body_bytes'] / 1024:.0f} | "
                     f"{r['parse_us']:.1f} | {r['route_us']:.1f} | {r['total_us']:.1f} |")
        L.append("")
    L.append("## Workload parameters and why\n")
    L.append(f"Time scale {TIME_SCALE:g}: the sims run 10x faster than the modelled GPU replica, and every client "
             "time (tool/think time, arrival rate, trace speed-up) is divided by 10, so utilisation and cache "
             "reuse are those of the real-time fleet; so are the filter's scrape period, timeout and staleness "
             f"limit ({SCALED_METRICS['period_ms']}/{SCALED_METRICS['timeout_ms']}/{SCALED_METRICS['stale_after_ms']} ms "
             "for the defaults 500/400/2000 ms). Token lengths are not scaled. The single-replica reference "
             "is one sim with 3x the KV capacity and 3x the speed (time scale 30) behind Envoy: the fleet's "
             "total capacity in one cache.\n")
    for name, w in WORKLOADS.items():
        args = w["quick" if res["quick"] else "args"]
        cap = w["quick_capacity" if res["quick"] else "capacity"]
        L.append(f"- **{name}** (`warmroute-loadgen {' '.join(args)}`, `--kv-capacity-tokens {cap}`): {w['why']}")
    if res.get("lru"):
        L.append("\nConversation trace, single block-LRU over the replayed lines (ideal placement): "
                 + ", ".join(f"{k} tokens: {v * 100:.1f}%" for k, v in res["lru"].items()))
    L.append("")
    L.append("## How the client was checked\n")
    cpus = [r["client_cpu_util"] for r in rows if r.get("client_cpu_util") is not None]
    L.append("- `warmroute-loadgen`: bodies rendered before the clock starts, keep-alive pool, `TCP_NODELAY`, "
             "TTFT = arrival of the first SSE `data:` line, one client thread.")
    if cpus:
        L.append(f"- Client CPU utilisation per routing run (getrusage over the run / runtime): max {max(cpus):.2f}, "
                 f"mean {sum(cpus) / len(cpus):.2f} of one core; the sims' step times are 10x compressed, so a "
                 f"client that kept up at <= ~0.5 core adds at most a few ms to figures measured in hundreds of ms.")
    if ov:
        fl = ov["client_floor_1KB"]
        L.append(f"- Client floor straight to an instant backend: p50 {fl['e2e_ms']['p50'] * 1000:.0f} us; this is "
                 "common to runs with and without the filter, so it cancels in the added-latency figures.")
    L.append("")
    if res.get("notes"):
        L.append("## Analysis\n")
        L.extend(res["notes"])
        L.append("")
    return "\n".join(L)


def plot(res: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in res["quality"] if r["replicas"] in (1, 3) and r["gateways"] == 1]
    workloads = [w for w in WORKLOADS if any(r["workload"] == w for r in rows)]
    fig, axes = plt.subplots(2, 3, figsize=(19, 10))
    colors = {"reference_1_replica_3x": "#999999", "envoy_round_robin": "#d62728", "envoy_least_request": "#ff7f0e",
              "warmroute_cache_aware": "#2ca02c", "warmroute_prefix_hash": "#17becf", "warmroute_least_request": "#bcbd22",
              "warmroute_round_robin": "#9467bd", "warmroute_random": "#8c564b", "warmroute_sticky_session": "#1f77b4"}
    routers = [r for r in colors if any(x["router"] == r for x in rows)]

    def bars(ax, metric, title, ylabel, log=False):
        width = 0.8 / max(len(routers), 1)
        for j, rt in enumerate(routers):
            xs, ys = [], []
            for i, w in enumerate(workloads):
                r = find(rows, w, rt, replicas=1 if rt.startswith("reference") else 3)
                v = metric(r) if r else None
                if v is not None:
                    xs.append(i + (j - len(routers) / 2 + 0.5) * width)
                    ys.append(v)
            ax.bar(xs, ys, width, label=rt, color=colors[rt])
        ax.set_xticks(range(len(workloads)), workloads)
        ax.set_title(title)
        ax.set_ylabel(ylabel)
        if log:
            ax.set_yscale("log")
        ax.grid(axis="y", alpha=0.3)

    bars(axes[0][0], lambda r: (r["hit_rate"] or 0) * 100, "Fleet prefix-cache hit rate (3 replicas)", "%")
    if rows:
        axes[0][0].legend(fontsize=7, loc="upper right")
    bars(axes[0][1], lambda r: g(r, "ttft_ms", "p95"), "TTFT P95 (ms, log)", "ms", log=True)
    bars(axes[0][2], lambda r: g(r, "e2e_ms", "mean"), "End-to-end mean (ms, log; agent: step latency)", "ms", log=True)

    ax = axes[1][0]
    agent = [r for r in res["quality"] if r["workload"] == "agent"]
    if agent:
        labels = [f"{r['router'].replace('warmroute_', 'wr_').replace('envoy_', 'envoy_')}\n{r['replicas']}r{r['gateways']}g" for r in agent]
        x = range(len(agent))
        ax.bar([i - 0.2 for i in x], [g(r, "step_ms", "mean") or 0 for r in agent], 0.4, label="mean")
        ax.bar([i + 0.2 for i in x], [g(r, "step_ms", "p95") or 0 for r in agent], 0.4, label="P95")
        ax.set_xticks(list(x), labels, rotation=60, fontsize=7, ha="right")
        ax.set_title("Agent step latency (ms)")
        ax.legend(fontsize=8)
        ax.grid(axis="y", alpha=0.3)

    ax = axes[1][1]
    ov = res.get("overhead")
    if ov:
        labels = [f"{c['size']} {c['workers']}w" for c in ov["compare"]]
        x = range(len(labels))
        ax.bar([i - 0.2 for i in x], [c["added_p50_us"] for c in ov["compare"]], 0.4, label="added p50")
        ax.bar([i + 0.2 for i in x], [c["added_p99_us"] for c in ov["compare"]], 0.4, label="added p99")
        ax.scatter([i - 0.2 for i in x], [c["floor_added_p50_us"] for c in ov["compare"]], marker="_", s=300,
                   color="black", zorder=3, label="floor filter p50")
        for i, c in enumerate(ov["compare"]):
            ax.annotate(f"thr x{c['throughput_ratio']:.2f}\ncpu x{c['cpu_per_req_ratio']:.2f}", (i, 0),
                        xytext=(0, 4), textcoords="offset points", ha="center", fontsize=7)
        ax.axhline(50, color="grey", ls=":", lw=1)
        ax.axhline(150, color="grey", ls="--", lw=1)
        ax.set_xticks(list(x), labels)
        ax.set_title("Filter cost: added latency (us) vs no filter; limits 50/150 us")
        ax.legend(fontsize=8)
        ax.grid(axis="y", alpha=0.3)

    ax = axes[1][2]
    dc = res.get("decision")
    if dc:
        bk = [r for r in dc if r["axis"] == "backends"]
        pr = [r for r in dc if r["axis"] == "prompt"]
        ax.plot([r["backends"] for r in bk], [r["total_us"] for r in bk], "o-", label="vs backends (4k-token prompt)")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("backends (bottom) / prompt tokens / 512 (top curve x)")
        ax.plot([r["prompt_tokens"] / 512 for r in pr], [r["total_us"] for r in pr], "s-",
                label="vs prompt length (3 backends), x = tokens/512")
        for r in pr:
            ax.annotate(f"{r['prompt_tokens'] // 1024}k", (r["prompt_tokens"] / 512, r["total_us"]), fontsize=7,
                        xytext=(3, -8), textcoords="offset points")
        ax.set_title("Decision time, native (parse + route), us")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3, which="both")
    fig.suptitle(f"warmroute benchmark ({'quick' if res['quick'] else 'full'}), {res['started']}")
    fig.tight_layout()
    fig.savefig(path, dpi=90)


# ------------------------------------------------------------------ main

SECTIONS = ["agent", "conversation", "chat", "uniform", "scale8", "gateways", "reruns", "overhead", "memory",
            "decision"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smoke run (< 3 min): fewer routers and requests")
    ap.add_argument("--only", nargs="+", choices=SECTIONS, help="run only these sections")
    ap.add_argument("--out", default=str(RESULTS), help="results directory")
    ap.add_argument("--merge", action="store_true",
                    help="keep the rows/sections of the existing latest.json that this run does not redo")
    ap.add_argument("--report-only", action="store_true",
                    help="re-render latest.md / latest.png (and targets, notes.md) from latest.json, run nothing")
    a = ap.parse_args()
    if a.report_only:
        out = Path(a.out)
        res = json.loads((out / "latest.json").read_text())
        res["targets"] = targets(res["quality"], res.get("overhead"), res.get("reruns"))
        notes_file = HERE / "notes.md"
        res["notes"] = [notes_file.read_text()] if notes_file.exists() and not res["quick"] else []
        (out / "latest.json").write_text(json.dumps(res, indent=1) + "\n")
        (out / "latest.md").write_text(markdown(res))
        plot(res, out / "latest.png")
        return 0
    for p in (LOADGEN_BIN, ROOT / "target" / "release" / "warmroute-sim", ROOT / "dist" / "warmroute.wasm"):
        if not p.exists():
            print(f"{p} missing: run `make build`", file=sys.stderr)
            return 1
    sections = a.only or (["agent", "conversation", "chat", "uniform", "gateways", "overhead", "decision"]
                          if a.quick else SECTIONS)
    if a.quick and not a.only:
        sections = ["agent", "conversation", "uniform", "gateways", "overhead", "decision"]
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    logdir = Path(tempfile.mkdtemp(prefix="warmroute-bench-"))
    print(f"logs: {logdir}", flush=True)
    b = Bench(a.quick, logdir)
    t0 = time.time()
    res: dict = {"quick": a.quick, "started": time.strftime("%Y-%m-%d %H:%M:%S"), "sections": sections,
                 "machine": f"{os.cpu_count()} cores, {os.uname().machine}, Linux {os.uname().release}",
                 "envoy_version": subprocess.run([envoy_binary(), "--version"], capture_output=True,
                                                 text=True).stdout.strip().split("version:")[-1].strip()[:60]}
    ov = mem = dc = None
    try:
        for s in sections:
            if s in WORKLOADS:
                b.workload_section(s)
            elif s == "scale8":
                b.scale8()
            elif s == "gateways":
                b.gateways()
            elif s == "reruns":
                b.reruns_section()
            elif s == "overhead":
                ov = overhead(b)
            elif s == "memory":
                mem = memory(b)
            elif s == "decision":
                dc = decision_curve(b)
    finally:
        res.update({"quality": b.rows, "reruns": b.reruns, "overhead": ov, "memory": mem, "decision": dc,
                    "wall_s": time.time() - t0})
        if a.merge and (out / "latest.json").exists():
            old = json.loads((out / "latest.json").read_text())
            new_keys = {row_key(r) for r in b.rows}
            res["quality"] = [r for r in old.get("quality", []) if row_key(r) not in new_keys] + b.rows
            order = {w: i for i, w in enumerate(WORKLOADS)}
            res["quality"].sort(key=lambda r: (r["replicas"] == 8, r["gateways"] > 1, order.get(r["workload"], 9)))
            if not res["reruns"] and old.get("reruns"):
                res["reruns"] = old["reruns"]
            for k in ("overhead", "memory", "decision", "lru"):
                if res.get(k) is None and old.get(k) is not None:
                    res[k] = old[k]
            res["wall_s"] = old.get("wall_s", 0) + res["wall_s"]
            res["sections"] = sorted(set(old.get("sections", [])) | set(sections))
            res["quick"] = old.get("quick", a.quick)
        if "conversation" in sections:
            lim = int(WORKLOADS["conversation"]["quick" if a.quick else "args"][2])
            cap = WORKLOADS["conversation"]["quick_capacity" if a.quick else "capacity"]
            res["lru"] = {str(c): lru_hit_rate(c, lim) for c in sorted({400_000, cap, 3 * cap, 10**9})}
        res["targets"] = targets(res["quality"], res.get("overhead"), res.get("reruns"))
        notes_file = HERE / "notes.md"
        res["notes"] = [notes_file.read_text()] if notes_file.exists() and not a.quick else []
        (out / "latest.json").write_text(json.dumps(res, indent=1) + "\n")
        (out / "latest.md").write_text(markdown(res))
        try:
            plot(res, out / "latest.png")
        except Exception as e:  # a plot failure must not lose the measurements
            print(f"plot failed: {e!r}", file=sys.stderr)
        print(f"\nwrote {out / 'latest.json'}, latest.md, latest.png ({time.time() - t0:.0f} s)")
        for t in res["targets"]:
            print(f"  [{t['result']}] {t['target']}: {t['measured']} (limit {t['limit']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
