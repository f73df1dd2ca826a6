"""`make real-smoke` (part of `make test`): one real vLLM replica (CPU build) behind the real
Envoy with the real `dist/warmroute.wasm`, checking the two things the filter reads of the
engine that no simulator can vouch for:

1. the metric names: for every gauge the filter's vLLM preset reads (running, waiting, KV
   usage, `cache_config_info`; the names as `filter/core/src/config/mod.rs` lists them),
   vLLM prints one of them, with the label set vLLM prints; the filter marks the pod healthy
   (its scrape answers) and its KV capacity gauge, the one gauge it exports of what it read,
   is `num_gpu_blocks x block_size` from `cache_config_info`;
2. the usage report: the same prompt sent twice (streamed, `include_usage`) is a predicted hit
   the second time, vLLM reports `prompt_tokens_details.cached_tokens` for it, and the filter
   reads that report (`feedback.reports` counts it, `feedback.reported_tokens` is what vLLM
   said).

The set-up is `make real-setup` (cached; 51 s on a fresh machine, `docs/real-engine.md`); the
replica takes about a minute to start. Everything binds 127.0.0.1; the replica is killed (its
process group) at the end. `make real` is the whole harness.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from engine import BLOCK_SIZE, SERVED, Replica, start_all, stop_all
from run import label, labels_of
from warmroute_harness import ROOT, Envoy, free_port, post

# What the filter's vLLM preset reads, each by any of these names (filter/core/src/config/mod.rs).
READS = {
    "running": ["vllm:num_requests_running"],
    "waiting": ["vllm:num_requests_waiting"],
    "KV usage": ["vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"],
    "KV size": ["vllm:cache_config_info"],
}
BLOCKS = 160
# About 1,000 tokens: every request's prefix is whole blocks of the filter's index (256 bytes)
# many times over, so the second send is a predicted hit.
PROMPT = " ".join(f"Line {i}: the gateway routes each prompt to the replica that holds it." for i in range(60))


def stat(stats: dict[str, str], name: str) -> int:
    return int(float(stats.get(f"wasmcustom.warmroute.{name}", "0")))


def usage_of(body: bytes) -> dict:
    """The `usage` of a streamed answer (its last data line that carries one)."""
    usage: dict = {}
    for line in body.decode().splitlines():
        if line.startswith("data: {"):
            usage = json.loads(line[6:]).get("usage") or usage
    return usage


def main() -> int:
    t0 = time.time()
    logdir = ROOT / ".run" / "real" / f"smoke-{time.strftime('%Y%m%d-%H%M%S')}"
    logdir.mkdir(parents=True, exist_ok=True)
    replica = Replica("vllm-0", free_port(), blocks=BLOCKS, core=0, max_model_len=3072)
    failures: list[str] = []
    envoy = None
    try:
        start_all([replica], logdir)
        print(f"real-smoke: vLLM up in {replica.started_s:.0f} s (logs: {logdir})")
        text = replica.metrics_text()
        for what, names in READS.items():
            printed = [n for n in names if labels_of(text, n)]
            shown = labels_of(text, printed[0])[0] if printed else []
            print(f"  {what}: {', '.join(printed) or 'none of ' + ', '.join(names)}"
                  + (f" {{{', '.join(shown[:6])}{', ...' if len(shown) > 6 else ''}}}" if printed else ""))
            if not printed:
                failures.append(f"vLLM prints none of {names} ({what})")
        envoy = Envoy([replica], filter_overrides={"debug_header": True}, concurrency=1)
        envoy.start(logdir)
        envoy.wait_scraped(replica)
        stats = envoy.settled_stats()
        healthy = stat(stats, f"backend.{replica.name}.healthy")
        kv = stat(stats, f"backend.{replica.name}.kv_capacity_tokens")
        want_kv = int(label(text, "vllm:cache_config_info", "num_gpu_blocks") or 0) * \
            int(label(text, "vllm:cache_config_info", "block_size") or 0)
        print(f"  filter: healthy {healthy}, KV capacity {kv} tokens (cache_config_info: {want_kv}, "
              f"{BLOCKS} blocks of {BLOCK_SIZE} asked), scrapes ok {stat(stats, 'scrape.ok')}, "
              f"failed {stat(stats, 'scrape.failed')}")
        if healthy != 1:
            failures.append(f"the filter's healthy gauge is {healthy}")
        if kv != want_kv or kv != BLOCKS * BLOCK_SIZE:
            failures.append(f"the filter's KV capacity {kv} is not cache_config_info's {want_kv}")
        body = {"model": SERVED, "max_tokens": 4, "stream": True, "stream_options": {"include_usage": True},
                "messages": [{"role": "user", "content": PROMPT}]}
        answers = [post(envoy.port, "/v1/chat/completions", body) for _ in range(2)]
        stats = envoy.settled_stats()
        usage = [usage_of(a.body) for a in answers]
        cached = [(u.get("prompt_tokens_details") or {}).get("cached_tokens") for u in usage]
        reports, reported = stat(stats, "feedback.reports"), stat(stats, "feedback.reported_tokens")
        print(f"  usage: statuses {[a.status for a in answers]}, prompt tokens "
              f"{[u.get('prompt_tokens') for u in usage]}, cached {cached}; routed "
              f"{[a.headers.get('x-warmroute', '') for a in answers]}; filter: reports {reports}, "
              f"reported tokens {reported}")
        if [a.status for a in answers] != [200, 200]:
            failures.append(f"answers {[a.status for a in answers]}")
        if not cached[1]:
            failures.append(f"vLLM reported no cached tokens for the repeated prompt ({usage[1]})")
        if reports != 1 or reported != (cached[1] or 0):
            failures.append(f"the filter read {reports} reports of {reported} tokens, not vLLM's one of {cached[1]}")
    finally:
        if envoy is not None:
            envoy.stop()
        stop_all([replica])
    for f in failures:
        print(f"  FAILED: {f}")
    print(f"real-smoke: {'passed' if not failures else 'FAILED'} in {time.time() - t0:.0f} s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
