"""The cost of the filter: added latency, throughput and CPU per request against an instant
backend (overhead), Envoy's memory after many distinct prefixes (memory), and the native
decision-time curve (decision).

Routing quality hides the filter's own cost behind the sims' compute, so these runs put
Envoy in front of a backend that answers at once. The helper crates they build are members
of the root Cargo workspace: the floor filter (bench/floor-filter), the no-op ext_proc picker
(bench/extproc-floor) and the decision bench (bench/decision); the phase-timing variant of warmroute gets its own target folder so it
never replaces the shipped build's output.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path
from statistics import median

from extproc import EXTPROC_PACKAGE, ExtProcEnvoy
from measure import loadgen, proc_cpu_s, proc_rss_kb
from quality import Bench
from warmroute_harness import ROOT, Envoy, Sim, free_port, get, spawn_envoy, stop_envoy

# The cargo package of the Wasm filter, whose phase-timing variant the overhead section builds.
FILTER_PACKAGE = "warmroute-filter"
FLOOR_PACKAGE = "warmroute-floor-filter"
DECISION_PACKAGE = "warmroute-decision-bench"


def cargo_build(*args: str) -> Path:
    """`cargo build --release <args>` from the repository root; returns the artifact of the
    package built (an executable, or a .wasm). Cargo reports where it wrote each artifact,
    dependencies first, so no target path or library name is spelled out here."""
    p = subprocess.run(["cargo", "build", "--release", "-q", "--message-format=json-render-diagnostics", *args],
                       check=True, timeout=900, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    found = None
    for line in p.stdout.splitlines():
        msg = json.loads(line)
        if msg.get("reason") == "compiler-artifact":
            files = [msg["executable"]] if msg.get("executable") else [f for f in msg["filenames"] if f.endswith(".wasm")]
            found = Path(files[0]) if files else found
    if found is None:
        raise RuntimeError(f"cargo build {' '.join(args)} reported no executable or .wasm")
    return found


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
                                "max_request_bytes": 16777216}},
                            {"name": "envoy.filters.http.router", "typed_config": {
                                "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}},
                        ],
                    }}]}],
            })
        return {"admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": self.admin}}},
                "static_resources": {"listeners": listeners}}

    def __enter__(self) -> "InstantBackend":
        self.proc = spawn_envoy(self.config(), "instant", self.logdir, self.admin, concurrency=1, level="warning")
        return self

    def __exit__(self, *exc) -> None:
        stop_envoy(self.proc, grace=10)

    def sims(self) -> list[Sim]:
        return [Sim(f"sim-{i}", p) for i, p in enumerate(self.ports)]


def uniform_args(words: int, requests: int, seed: int) -> list[str]:
    return ["uniform", "--api", "chat", "--prompt-tokens", str(words), "--output-tokens", "1",
            "--requests", str(requests), "--rate", "1000000", "--seed", str(seed)]


# The filter's four phases, then the router's steps inside `route` (filter/core/src/phases.rs).
PHASE_NAMES = ["body", "parse", "route", "header"]
STEP_NAMES = ["ledger", "sync", "loads", "match", "policy", "account", "record", "log"]
PHASES_LINE = re.compile(r"warmroute phases: n=(\d+) ((?:\w+_ns=\d+ ?)+)")


def build_phases_filter() -> Path:
    """warmroute built with `phase-timing`: it logs where a request's time goes inside the VM.

    Built in its own target folder: the variant has the shipped module's file name, and in
    the workspace's folder it would replace the build `make wasm` copies to dist/."""
    return cargo_build("--target", "wasm32-wasip1", "-p", FILTER_PACKAGE, "--features", "phase-timing",
                       "--target-dir", str(ROOT / "target" / "bench-phases"))


def phase_breakdown(log: Path) -> dict:
    """Mean µs per phase (and per router step, when the build logs them) over every
    `warmroute phases` line an Envoy log holds."""
    lines = []
    for m in PHASES_LINE.finditer(log.read_text(errors="replace")):
        fields = dict(f.split("_ns=") for f in m.group(2).split())
        lines.append((int(m.group(1)), {k: int(v) for k, v in fields.items()}))
    n = sum(x[0] for x in lines)
    names = [k for k in PHASE_NAMES + STEP_NAMES if lines and all(k in x[1] for x in lines)]
    return {"requests": n, **{f"{k}_us": sum(c * x[k] for c, x in lines) / max(n, 1) / 1000 for k in names}}


def build_floor_filter() -> Path:
    """bench/floor-filter: target/wasm32-wasip1/release/floor.wasm."""
    return cargo_build("--target", "wasm32-wasip1", "-p", FLOOR_PACKAGE)




def paired_rounds(gw: dict[str, Envoy], words: int, rounds: int, lat_n: int, thr_n: int, rdir: Path,
                  tag: str) -> dict[str, dict]:
    """Starts the gateways, warms each up, then measures them in `rounds` rounds whose order
    reverses every round (ABC, CBA, ...): per round and gateway, `lat_n` requests one at a
    time (p50/p99/mean, CPU per request) then `thr_n` at 32 in flight (throughput, CPU per
    request at load). A gateway's CPU is that of every process it names (`pids()`: Envoy, and
    the ext_proc picker beside it); `cpu_load_companion` is the part of `cpu_load` spent outside
    Envoy. Returns each gateway's per-round lists; stops the gateways."""
    for e in gw.values():
        e.start(rdir)
    per: dict = {g: {"p50": [], "p99": [], "mean": [], "cpu_seq": [], "rps": [], "cpu_load": [],
                     "cpu_load_companion": [], "errors": 0}
                 for g in gw}

    def cpu(e: Envoy) -> list[float]:
        return [proc_cpu_s(pid) for pid in e.pids()]

    names = list(gw)
    try:
        for g, e in gw.items():  # warm-up (connections, VM, index)
            loadgen(uniform_args(words, 50, 99), [f"http://127.0.0.1:{e.port}"], [],
                    rdir / f"{tag}-{g}-warm.json", 60, ["--concurrency", "1"])
        for r in range(rounds):
            for g in (names if r % 2 == 0 else names[::-1]):
                e, m = gw[g], per[g]
                target = [f"http://127.0.0.1:{e.port}"]
                c0 = cpu(e)
                lat = loadgen(uniform_args(words, lat_n, 1 + r), target, [],
                              rdir / f"{tag}-{g}-r{r}-lat.json", 120, ["--concurrency", "1"])
                c1 = cpu(e)
                thr = loadgen(uniform_args(words, thr_n, 100 + r), target, [],
                              rdir / f"{tag}-{g}-r{r}-thr.json", 120, ["--concurrency", "32", "--threads", "1"])
                c2 = cpu(e)
                m["p50"].append(lat["e2e_ms"]["p50"])
                m["p99"].append(lat["e2e_ms"]["p99"])
                m["mean"].append(lat["e2e_ms"]["mean"])
                m["cpu_seq"].append((sum(c1) - sum(c0)) / max(lat["ok"], 1) * 1e6)
                m["rps"].append(thr["throughput_rps"])
                m["cpu_load"].append((sum(c2) - sum(c1)) / max(thr["ok"], 1) * 1e6)
                m["cpu_load_companion"].append((sum(c2[1:]) - sum(c1[1:])) / max(thr["ok"], 1) * 1e6)
                m["errors"] += lat["errors"] + thr["errors"]
    finally:
        for e in gw.values():
            e.stop()
    return per


def overhead(b: Bench, rounds: int | None = None) -> dict:
    """Added latency, max throughput and CPU per request, with vs without the filter, and
    against the architecture the peers chose.

    The gateways (same Envoy binary and config: no filter, the floor filter, warmroute, the
    ext_proc hop) run side by side in front of the same instant backend, and the measurement
    alternates between them in rounds (ABCD, DCBA, ...): this machine's speed drifts by 2x over
    minutes (shared cores), so sequential phases measure the drift as much as the filter. Added
    latency is the median over rounds of the paired per-round p50/p99 differences. The floor
    filter holds the headers, buffers the body, reads it into the VM and writes the routing
    header, nothing else: what Envoy charges any filter that routes on the body, which warmroute
    cannot go below. The ext_proc hop is the Gateway API Inference Extension's architecture
    (bench/extproc.py): Envoy streams headers and both bodies to a picker process over gRPC, as
    GIE configures it, and the picker is a no-op (bench/extproc-floor) with as many threads as
    Envoy has workers; its CPU counts with Envoy's."""
    print("== cost of the filter", flush=True)
    floor_wasm = build_floor_filter()
    picker_bin = cargo_build("-p", EXTPROC_PACKAGE)
    phases_wasm = build_phases_filter()
    rdir = b.logdir / "overhead"
    rdir.mkdir()
    # 1 KB and 128 KB chat bodies (pseudo-words are ~8.5 bytes with JSON overhead).
    sizes = {"1KB": 110, "128KB": 15000}
    full_rounds = 4 if b.quick else 8
    lat_n = {"1KB": 600 if b.quick else 3000, "128KB": 200 if b.quick else 1000}
    thr_n = {"1KB": 1500 if b.quick else 8000, "128KB": 300 if b.quick else 1500}
    # Fewer rounds (the fast profile) keep each round's requests: the same measurement, fewer times.
    rounds = rounds or full_rounds
    lat_n = {k: v * rounds // full_rounds for k, v in lat_n.items()}
    thr_n = {k: v * rounds // full_rounds for k, v in thr_n.items()}
    out: dict = {"runs": [], "rounds": rounds}
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
                # No filter, the floor any body-routing Wasm filter pays (bench/floor-filter), warmroute.
                gw = {"nofilter": Envoy(be.sims(), concurrency=workers, with_filter=False, lb="round_robin"),
                      "floor": Envoy(be.sims(), concurrency=workers, filter_overrides=filter_cfg,
                                     wasm_file=floor_wasm),
                      "warmroute": Envoy(be.sims(), concurrency=workers, filter_overrides=filter_cfg),
                      "extproc": ExtProcEnvoy(be.sims(), concurrency=workers, picker_bin=picker_bin,
                                              picker_threads=workers)}
                per = paired_rounds(gw, words, rounds, lat_n[size] // rounds, thr_n[size] // rounds, rdir,
                                    f"{size}-{workers}w")
                for g, m in per.items():
                    run = {"size": size, "workers": workers, "gateway": g,
                           "p50_ms": median(m["p50"]), "p99_ms": median(m["p99"]), "mean_ms": median(m["mean"]),
                           "cpu_us_per_req_seq": median(m["cpu_seq"]), "max_rps": median(m["rps"]),
                           "cpu_us_per_req_load": median(m["cpu_load"]), "errors": m["errors"],
                           "p50_ms_rounds": m["p50"]}
                    if any(m["cpu_load_companion"]):
                        run["cpu_us_per_req_load_companion"] = median(m["cpu_load_companion"])
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
                    "cpu_per_req_vs_floor": ratio("floor", "warmroute", "cpu_load"),
                    "cpu_us_per_req_filter": median(per["warmroute"]["cpu_load"]),
                    "cpu_us_per_req_floor": median(per["floor"]["cpu_load"]),
                    "cpu_us_per_req_nofilter": median(per["nofilter"]["cpu_load"]),
                    # Against the ext_proc hop (GIE's architecture, its picker a no-op): its CPU is
                    # Envoy's and the picker's.
                    "extproc_added_p50_us": median(paired("nofilter", "extproc", "p50")),
                    "extproc_added_p99_us": median(paired("nofilter", "extproc", "p99")),
                    "extproc_added_p50_us_rounds": paired("nofilter", "extproc", "p50"),
                    "extproc_throughput_ratio": ratio("nofilter", "extproc", "rps"),
                    "cpu_us_per_req_extproc": median(per["extproc"]["cpu_load"]),
                    "cpu_us_per_req_extproc_picker": median(per["extproc"]["cpu_load_companion"]),
                    "cpu_per_req_vs_extproc": ratio("extproc", "warmroute", "cpu_load"),
                })
                c = out["compare"][-1]
                c["added_p50_vs_extproc"] = c["added_p50_us"] / max(c["extproc_added_p50_us"], 1e-9)
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
                # The build logs every 100 requests: a quick run's 128 KB pass may log none.
                if c["phases"]["requests"]:
                    print(f"  {size}-{workers}w inside the VM (mean over {c['phases']['requests']} requests): "
                          + ", ".join(f"{k} {c['phases'][f'{k}_us']:.0f} us" for k in ("body", "parse", "route", "header")),
                          flush=True)
                print(f"  {size}-{workers}w added p50 {c['added_p50_us']:.0f} us (rounds: "
                      f"{', '.join(f'{x:.0f}' for x in added)}); floor {c['floor_added_p50_us']:.0f} us, "
                      f"warmroute over floor {c['over_floor_p50_us']:.0f} us; CPU/req x{c['cpu_per_req_ratio']:.2f} "
                      f"(floor x{c['floor_cpu_per_req_ratio']:.2f}; warmroute/floor x{c['cpu_per_req_vs_floor']:.2f})",
                      flush=True)
                print(f"  {size}-{workers}w ext_proc hop added p50 {c['extproc_added_p50_us']:.0f} us, p99 "
                      f"{c['extproc_added_p99_us']:.0f} us; CPU/req {c['cpu_us_per_req_extproc']:.0f} us (picker "
                      f"{c['cpu_us_per_req_extproc_picker']:.0f}); warmroute/ext_proc: added p50 "
                      f"x{c['added_p50_vs_extproc']:.2f}, CPU/req x{c['cpu_per_req_vs_extproc']:.2f}", flush=True)
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
    """Envoy's RSS, its heap figures (admin /memory) and the Wasm VMs' memory stats."""
    out: dict = {"rss_kb": proc_rss_kb(e.proc.pid)}
    mem = json.loads(get(e.admin_port, "/memory"))
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
    """Decision time against pods and prompt length: natively (bench/decision: parse + route
    medians, router-step means), then inside Envoy's VM (phase timing, `envoy_decision_curve`),
    whose rows have the axis `envoy-pods` or `envoy-prompt`."""
    print("== decision time (native)", flush=True)
    # bench/decision: target/release/warmroute-decision-bench.
    decision_bin = cargo_build("-p", DECISION_PACKAGE)
    p = subprocess.run([str(decision_bin), *(["--quick"] if b.quick else [])], check=True, capture_output=True,
                       text=True, timeout=300)
    rows = [json.loads(l) for l in p.stdout.splitlines() if l.strip()]
    for r in rows:
        print(f"  {r['axis']:8s} backends {r['backends']:4d} prompt {r['prompt_tokens']:7d} tok "
              f"({r['body_bytes'] / 1024:6.0f} KB): parse {r['parse_us']:7.1f} us  route {r['route_us']:7.1f} us  ("
              + ", ".join(f"{k} {v:.1f}" for k, v in r["steps"].items()) + ")")
    print("== decision time (inside Envoy, phase timing)", flush=True)
    rdir = b.logdir / "decision"
    rdir.mkdir()
    envoy_rows = envoy_decision_curve(rdir, build_phases_filter(), tokens=ENVOY_TOKENS[:3] if b.quick else ENVOY_TOKENS,
                                      requests=200 if b.quick else 300)
    return rows + [{**r, "axis": f"envoy-{r['axis']}"} for r in envoy_rows]


# The in-Envoy decision curve (#18): pods 3 -> 1024 at a 4k-token prompt, prompts 1k -> 512k
# tokens at 16 pods.
ENVOY_PODS = (3, 16, 64, 256, 1024)
ENVOY_TOKENS = (1024, 16384, 131072, 524288)


def envoy_decision_curve(logdir: Path, wasm: Path, pods=ENVOY_PODS, tokens=ENVOY_TOKENS, requests: int = 300) -> list[dict]:
    """Phase and router-step means inside Envoy's VM (one worker) as the pods and the prompt grow.

    Three instant backends are the pool's endpoints; the filter lists `pods` backends, the rest
    at addresses nothing listens on and no cluster holds: a request routed there (or a scrape
    of one) falls back to the pool's round robin and is answered anyway, so every pod looks
    served and healthy, and the filter decides over the whole list. Prompts are uniform (no
    shared prefix): every request is a placement, the path a new conversation takes."""
    rows = []
    with InstantBackend(3, logdir) as be:
        points = [("pods", n, 4096) for n in pods] + [("prompt", 16, t) for t in tokens]
        for axis, n, t in points:
            sims = be.sims() + [Sim(f"pod-{i}", 20000 + i) for i in range(3, n)]
            # Scrapes of 1024 pods every 0.5 s would load the machine; 5 s keeps them fresh.
            cfg = {"strategy": "cache_aware", "debug_header": False,
                   "metrics": {"period_ms": 5000, "stale_after_ms": 20000}}
            e = Envoy(sims, concurrency=1, filter_overrides=cfg, wasm_file=wasm, endpoints=be.sims())
            e.start(logdir)
            # Fewer requests of the longest prompts: building and sending them dominates.
            k = max(100, min(requests, requests * 16384 // t))
            try:
                rep_ = loadgen(uniform_args(t, k, 77), [f"http://127.0.0.1:{e.port}"], [],
                               logdir / f"curve-{axis}-{n}-{t}.json", 300, ["--concurrency", "1"])
            finally:
                e.stop()
            ph = phase_breakdown(logdir / f"envoy-{e.port}.log")
            rows.append({"axis": axis, "backends": n, "prompt_tokens": t, "ok": rep_["ok"],
                         "errors": rep_["errors"], **ph})
            print(f"  in Envoy {axis:6s} pods {n:5d} prompt {t:7d} tok ({ph['requests']} requests): "
                  + ", ".join(f"{k_} {ph[k_ + '_us']:.1f}" for k_ in PHASE_NAMES + STEP_NAMES if k_ + "_us" in ph)
                  + " us", flush=True)
    return rows