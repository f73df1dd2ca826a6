"""`make real`: warmroute in front of real vLLM (CPU build) replicas, through the real Envoy
with the real `dist/warmroute.wasm`, and a table of what that showed.

1. Metrics: every replica's real `/metrics` as the filter reads it (the names it is
   configured with, their label sets, `vllm:cache_config_info`), Envoy's per-pod scrape
   counts and the filter's health gauges.
2. The win and the index's error: a multi-turn chat and an agent workload, each once through
   Envoy's round robin (no filter) and once through warmroute, from cold caches
   (`/reset_prefix_cache`) and a fresh Envoy each time. Hit rate from the engines' own
   counters (`vllm:prefix_cache_hits_total` / `queries_total`), TTFT at the client, and per
   request the filter's predicted cached share (its debug header's `match=M/T`) against the
   engine's `cached_tokens`; the bytes per token the filter learns against the tokenizer's.
3. API shapes: chat and completions, streamed with and without `include_usage`, tools and
   tool messages, content parts, `/v1/models`, through the harness's client and through the
   `openai` package.
4. Down and up: a replica killed is marked down, and once restarted, up again.
5. The APIs agents speak (`agents.py`): a 10-turn `/v1/responses` conversation by
   `previous_response_id` (the replicas keep stored responses, `VLLM_ENABLE_RESPONSES_API_STORE=1`),
   each follow-up on the pod that holds its predecessor and hitting its cache; the same
   follow-up through round robin (404); an agent's `/v1/messages` turns, each predicted as an
   extension of the last.

Everything runs on 127.0.0.1 and every replica is killed (its process group) at the end.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import time
from pathlib import Path

import agents
from engine import BLOCK_SIZE, REAL_PY, SERVED, Replica, start_all, stop_all
from shapes import check
from warmroute_harness import ROOT, Envoy, filter_config, free_port, post
from workloads import Record, Workload, agent_workload, chat_workload, play

HERE = Path(__file__).resolve().parent
# The filter reads these from every pod (its configured names, envoy.yaml's defaults) and
# `vllm:cache_config_info` for the KV size; the prefix-cache counters are what this run
# measures the win with.
READ = ["vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
        "vllm:gpu_cache_usage_perc", "vllm:cache_config_info", "vllm:prefix_cache_hits_total",
        "vllm:prefix_cache_queries_total"]
DEBUG = {"debug_header": True, "debug_match_counts": True}


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


def labels_of(text: str, name: str) -> list[list[str]]:
    """The label names of each sample of `name`, as the engine printed them."""
    out = []
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            body = line[len(name):].split("}", 1)[0].lstrip("{")
            out.append([kv.split("=", 1)[0] for kv in body.split('",') if "=" in kv])
    return out


def label(text: str, name: str, key: str) -> str | None:
    for line in text.splitlines():
        if line.startswith(name + "{"):
            for kv in line.split("{", 1)[1].rsplit("}", 1)[0].split('",'):
                k, _, v = kv.partition("=")
                if k == key:
                    return v.strip('"')
    return None


def section(title: str) -> None:
    print(f"\n## {title}\n", flush=True)


def metrics_section(replicas: list[Replica], envoy: Envoy, out: dict) -> None:
    section("1. The filter reads each replica's real /metrics")
    names = filter_config(envoy.config)["metrics"] if "metrics" in filter_config(envoy.config) else {}
    texts = {r.name: r.metrics_text() for r in replicas}
    print("| metric | printed by vLLM | label names |")
    print("|---|---|---|")
    for n in READ:
        ls = labels_of(texts[replicas[0].name], n)
        seen = all(labels_of(t, n) for t in texts.values())
        print(f"| `{n}` | {'yes, every replica' if seen else 'no'} | {', '.join(ls[0][:6]) + (', …' if ls and len(ls[0]) > 6 else '') if ls else ''} |")
    for r in replicas:
        envoy.wait_scraped(r)
    stats = envoy.settled_stats()
    hosts = envoy.host_stats("pool-metrics")
    print("\n| replica | KV from cache_config_info | scrapes answered (Envoy) | filter's healthy gauge |")
    print("|---|---|---|---|")
    for r in replicas:
        t = texts[r.name]
        blocks, size = label(t, "vllm:cache_config_info", "num_gpu_blocks"), label(t, "vllm:cache_config_info", "block_size")
        ok = hosts.get(r.port, {}).get("rq_success", 0)
        healthy = stats.get(f"wasmcustom.warmroute.backend.{r.name}.healthy")
        print(f"| {r.name} | {blocks} blocks x {size} = {int(blocks) * int(size)} tokens | {ok} | {healthy} |")
        out.setdefault("replicas", {})[r.name] = {"start_s": round(r.started_s, 1), "scrapes_ok": ok,
                                                  "healthy": healthy, "kv_tokens": int(blocks) * int(size)}
    print(f"\nscrapes: ok {stats.get('wasmcustom.warmroute.scrape.ok')}, failed "
          f"{stats.get('wasmcustom.warmroute.scrape.failed')}, slow {stats.get('wasmcustom.warmroute.scrape.slow')}; "
          f"metrics names configured: {names.get('names', 'the defaults')}")
    out["metrics_bytes"] = {k: len(v) for k, v in texts.items()}


def engine_counters(replicas: list[Replica]) -> dict[str, dict[str, float]]:
    out = {}
    for r in replicas:
        m = r.metrics()
        out[r.name] = {k: m.get(k, 0.0) for k in
                       ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total",
                        "vllm:request_success_total", "vllm:num_preemptions_total")}
    return out


def reset_caches(replicas: list[Replica]) -> None:
    for r in replicas:
        rep = post(r.port, "/reset_prefix_cache", b"")
        if rep.status != 200:
            raise RuntimeError(f"{r.name}: /reset_prefix_cache answered {rep.status}: {rep.body[:200]!r}")


def run_once(w: Workload, replicas: list[Replica], logdir: Path, router: str, bpt: float) -> dict:
    reset_caches(replicas)
    if router == "round robin":
        envoy = Envoy(replicas, with_filter=False, lb="round_robin", concurrency=1)
    else:
        envoy = Envoy(replicas, filter_overrides={**DEBUG, "index": {"bytes_per_token": bpt}}, concurrency=1)
    envoy.start(logdir)
    try:
        if router != "round robin":
            for r in replicas:
                envoy.wait_scraped(r)
        before = engine_counters(replicas)
        t0 = time.time()
        recs = play(w, envoy.port)
        wall = time.time() - t0
        after = engine_counters(replicas)
        stats = envoy.settled_stats() if router != "round robin" else {}
    finally:
        envoy.stop()
    d = {n: {k: after[n][k] - before[n][k] for k in after[n]} for n in after}
    hits = sum(v["vllm:prefix_cache_hits_total"] for v in d.values())
    queries = sum(v["vllm:prefix_cache_queries_total"] for v in d.values())
    ok = [r for r in recs if r.result.status == 200 and r.result.ttft_s is not None]
    ttft = [r.result.ttft_s * 1000 for r in ok]
    res = {"router": router, "workload": w.name, "requests": len(recs), "errors": len(recs) - len(ok),
           "hit_rate": hits / queries if queries else float("nan"), "ttft_mean_ms": statistics.fmean(ttft) if ttft else float("nan"),
           "ttft_p95_ms": pct(ttft, 0.95), "wall_s": wall,
           "share": {n: int(v["vllm:request_success_total"]) for n, v in d.items()},
           "preemptions": int(sum(v["vllm:num_preemptions_total"] for v in d.values())),
           "decisions": {k.rsplit(".", 1)[1]: int(v) for k, v in stats.items()
                         if k.startswith("wasmcustom.warmroute.decision.") and v != "0"},
           "feedback": {k.rsplit(".", 1)[1]: int(v) for k, v in stats.items()
                        if k.startswith("wasmcustom.warmroute.feedback.")}}
    if router != "round robin":
        res.update(index_error(ok, bpt, filter_block_bytes(envoy)))
    res["requests_detail"] = [
        {"session": r.session, "turn": r.turn, "status": r.result.status, "route": r.result.route,
         "prompt_tokens": r.result.prompt_tokens, "cached_tokens": r.result.cached_tokens,
         "ttft_ms": round((r.result.ttft_s or 0) * 1000, 1), "canonical_bytes": r.canonical_bytes}
        for r in recs]
    return res


def filter_block_bytes(envoy: Envoy) -> int:
    return int(envoy.filter.get("block_bytes", 256))


def index_error(recs: list[Record], start_bpt: float, block_bytes: int) -> dict:
    """The filter's predicted cached tokens (its debug header's match share of the prompt, as
    its feedback module converts it) against the engine's `cached_tokens`, per request; and
    the bytes per token the filter learns, by its own formula (routing/feedback.rs:
    TokenRatio) over the reports it reads: predicted hits of >= 32 full blocks."""
    errs, signed, pred_sum, rep_sum = [], [], 0.0, 0
    b, t, used = start_bpt * 4096, 4096.0, 0
    truth = []
    for r in recs:
        route = r.result.route
        m, _, tot = route.get("match", "0/0").partition("/")
        m, tot = int(m), int(tot or 0)
        pt, ct = r.result.prompt_tokens, r.result.cached_tokens
        if not pt:
            continue
        pred = m / tot * pt if tot else 0.0
        errs.append(abs(pred - ct))
        signed.append(pred - ct)
        pred_sum += pred
        rep_sum += ct
        if m > 0 and tot >= 32:
            b, t, used = b * 0.98 + tot * block_bytes, t * 0.98 + pt, used + 1
        if tot >= 32:
            truth.append(r.canonical_bytes / pt)
    return {"err_mean_tokens": statistics.fmean(errs) if errs else float("nan"), "err_p95_tokens": pct(errs, 0.95),
            "bias_tokens": statistics.fmean(signed) if signed else float("nan"),
            "predicted_tokens": round(pred_sum), "reported_tokens": rep_sum,
            "learned_bpt": b / t, "learned_from": used,
            "true_bpt": statistics.fmean(truth) if truth else float("nan"), "true_from": len(truth)}


def win_section(replicas: list, logdir: Path, out: dict, bpt: float, run=None,
                extra: tuple[str, str] | None = ("preemptions", "preemptions"), note=None) -> bool:
    """Chat and agent, round robin then warmroute, through `run` (this engine's `run_once`);
    prints both tables, with `extra` (a header and its row key) as the first's last column and
    `note(rows)` after the second. True if no request failed."""
    section("2. The win, by the engines' own counters, and the index against the engines' reports")
    rows = []
    for make in (chat_workload, agent_workload):
        for router in ("round robin", "warmroute"):
            w = make()
            if router == "round robin":
                print(f"- {w.name}: {w.why}")
            res = (run or run_once)(w, replicas, logdir, router, bpt)
            rows.append(res)
            print(f"  {router:11s} requests {res['requests']} errors {res['errors']} hit {res['hit_rate']:.3f} "
                  f"ttft mean {res['ttft_mean_ms']:.0f} ms p95 {res['ttft_p95_ms']:.0f} ms ({res['wall_s']:.0f} s)",
                  flush=True)
    out["runs"] = rows
    head, key = extra or ("", "")
    print("\n| workload | router | requests (errors) | hit rate (engines) | TTFT mean / P95 ms | per pod |"
          + (f" {head} |" if extra else ""))
    print("|---|---|---|---|---|---|" + ("---|" if extra else ""))
    for r in rows:
        share = " / ".join(str(v) for v in r["share"].values()) or "round robin"
        print(f"| {r['workload']} | {r['router']} | {r['requests']} ({r['errors']}) | {r['hit_rate']:.3f} | "
              f"{r['ttft_mean_ms']:.0f} / {r['ttft_p95_ms']:.0f} | {share} |" + (f" {r[key]} |" if extra else ""))
    print("\n| workload | index error, mean / P95 (tokens) | bias | predicted / reported tokens | "
          "bytes per token: learned (reports) / engine's | decisions |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        if r["router"] != "warmroute":
            continue
        print(f"| {r['workload']} | {r['err_mean_tokens']:.0f} / {r['err_p95_tokens']:.0f} | {r['bias_tokens']:+.0f} | "
              f"{r['predicted_tokens']} / {r['reported_tokens']} | {r['learned_bpt']:.2f} ({r['learned_from']}) / "
              f"{r['true_bpt']:.2f} | {r['decisions']} |")
    print(f"\n(the learned ratio starts at {bpt}; filter feedback counters: "
          f"{[r['feedback'] for r in rows if r['router'] == 'warmroute']}{note(rows) if note else ''})")
    return all(r["errors"] == 0 for r in rows)


def shapes_section(envoy: Envoy, replica: Replica, out: dict, fixtures: Path | None) -> bool:
    section("3. API shapes through warmroute: the harness's client, then the `openai` package")
    rows = check(envoy.port, replica.port, fixtures)
    proc = subprocess.run([str(REAL_PY), str(HERE / "openai_client.py"), f"http://127.0.0.1:{envoy.port}/v1", SERVED],
                          capture_output=True, text=True, timeout=300)
    oa = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not oa:
        oa.append({"shape": "openai client", "ok": False, "seen": proc.stderr[-300:]})
    print("| client | shape | ok | seen |")
    print("|---|---|---|---|")
    for r in rows:
        print(f"| harness | {r.shape} | {'yes' if r.ok else 'NO'} | {r.detail} |")
    for r in oa:
        print(f"| openai {openai_version()} | {r['shape']} | {'yes' if r['ok'] else 'NO'} | {r['seen']} |")
    out["shapes"] = [r.__dict__ for r in rows] + oa
    return all(r.ok for r in rows) and all(r["ok"] for r in oa)


def openai_version() -> str:
    return subprocess.run([str(REAL_PY), "-c", "import openai; print(openai.__version__)"],
                          capture_output=True, text=True).stdout.strip()


def health(envoy: Envoy, name: str) -> str | None:
    return envoy.stats().get(f"wasmcustom.warmroute.backend.{name}.healthy")


def down_up(replicas: list[Replica], envoy: Envoy, logdir: Path, out: dict, during) -> bool:
    """Kills the last replica, times the filter's down verdict, restarts it (running `during`
    meanwhile, on the others), times the up verdict after it answers /health again."""
    r = replicas[-1]
    t0 = time.time()  # from the signal: vLLM takes seconds to shut down, scrapes fail meanwhile
    r.stop()
    envoy.wait_for(f"{r.name} marked down", lambda: health(envoy, r.name) == "0", timeout=30)
    down_s = time.time() - t0
    sent = [post(envoy.port, "/v1/chat/completions",
                 {"model": SERVED, "max_tokens": 4, "messages": [{"role": "user", "content": f"while down {i}"}]},
                 headers={}) for i in range(6)]
    went = [s.headers.get("x-warmroute", "") for s in sent]
    r.spawn(logdir)
    t1 = time.time()
    ok = during()
    r.wait_ready()
    ready_s = time.time() - t1
    t2 = time.time()
    envoy.wait_for(f"{r.name} marked up", lambda: health(envoy, r.name) == "1", timeout=60)
    up_s = time.time() - t2
    stats = envoy.stats()
    section("4. A stopped replica is marked down, and up again once it is back")
    print("| event | seconds | seen |")
    print("|---|---|---|")
    print(f"| {r.name} sent SIGTERM -> filter's healthy gauge 0 | {down_s:.1f} | 6 requests while down: "
          f"{sum(s.status == 200 for s in sent)} answered 200, {sum(r.name in w for w in went)} sent to {r.name} |")
    print(f"| restarted -> /health answers | {ready_s:.0f} | scrapes while starting: slow "
          f"{stats.get('wasmcustom.warmroute.scrape.slow')}, failed {stats.get('wasmcustom.warmroute.scrape.failed')} |")
    print(f"| /health answers -> healthy gauge 1 | {up_s:.1f} | |")
    out["down_up"] = {"down_s": down_s, "restart_s": ready_s, "up_s": up_s,
                      "sent_while_down_ok": sum(s.status == 200 for s in sent),
                      "sent_to_down": sum(r.name in w for w in went)}
    return ok and all(s.status == 200 for s in sent) and not any(r.name in w for w in went)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--replicas", type=int, default=3)
    ap.add_argument("--blocks", type=int, default=160, help="KV per replica in 32-token blocks")
    ap.add_argument("--start-bytes-per-token", type=float, default=7.5,
                    help="the filter's starting ratio: envoy.yaml's (set for the simulator's word tokens)")
    ap.add_argument("--fixtures", type=Path, help="write the engine's answers here (bench/real/fixtures)")
    ap.add_argument("--json", type=Path, default=ROOT / ".run" / "real" / "results.json")
    ap.add_argument("--only", choices=["agents"], help="run only this section (replicas still start)")
    a = ap.parse_args()
    t_start = time.time()
    logdir = ROOT / ".run" / "real" / f"logs-{time.strftime('%Y%m%d-%H%M%S')}"
    logdir.mkdir(parents=True)
    if a.fixtures:
        a.fixtures.mkdir(parents=True, exist_ok=True)
    replicas = [Replica(f"vllm-{i}", free_port(), blocks=a.blocks, core=i % 2, max_model_len=3072,
                        extra_args=["--enable-auto-tool-choice", "--tool-call-parser", "hermes"],
                        extra_env={"VLLM_ENABLE_RESPONSES_API_STORE": "1"})
                for i in range(a.replicas)]
    out: dict = {"blocks": a.blocks, "block_size": BLOCK_SIZE}
    print(f"# warmroute in front of {a.replicas} real vLLM replicas (logs: {logdir})")
    ok = True
    envoy = None
    try:
        start_all(replicas, logdir)
        out["start_s"] = time.time() - t_start
        print(f"replicas up in {out['start_s']:.0f} s: "
              + ", ".join(f"{r.name} :{r.port} {r.blocks * BLOCK_SIZE} KV tokens" for r in replicas))
        if a.only == "agents":
            ok &= agents.section(replicas, logdir, out, a.fixtures)
            return finish(ok, out, a.json, t_start, replicas)
        envoy = Envoy(replicas, filter_overrides={**DEBUG, "index": {"bytes_per_token": a.start_bytes_per_token}},
                      concurrency=1)
        envoy.start(logdir)
        metrics_section(replicas, envoy, out)
        if a.fixtures:
            (a.fixtures / "vllm-metrics.txt").write_text(replicas[0].metrics_text())
        envoy.stop()
        win_section(replicas, logdir, out, a.start_bytes_per_token)
        envoy = Envoy(replicas, filter_overrides=DEBUG, concurrency=1)
        envoy.start(logdir)
        ok &= down_up(replicas, envoy, logdir, out,
                      lambda: shapes_section(envoy, replicas[0], out, a.fixtures))
        ok &= all(r["errors"] == 0 for r in out["runs"])
        envoy.stop()
        envoy = None
        ok &= agents.section(replicas, logdir, out, a.fixtures)
    finally:
        if envoy is not None:
            envoy.stop()
        stop_all(replicas)
    return finish(ok, out, a.json, t_start, replicas)


def finish(ok: bool, out: dict, path: Path, t_start: float, replicas: list[Replica]) -> int:
    stop_all(replicas)
    out["run_s"] = time.time() - t_start
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1, default=str))
    print(f"\nmake real: {'passed' if ok else 'FAILED'} in {out['run_s']:.0f} s (results: {path})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
