"""The benchmark's scenarios: workloads, time scale, routers, and which pairs are re-run.

Every routing-quality run is one workload (a `warmroute-loadgen` command line plus the
replicas' KV capacity) through one router; the tables here say which, and why each
workload is sized as it is, so the report can print the same reasons beside the results.
"""

from __future__ import annotations

import json
from collections import OrderedDict

from warmroute_harness import ROOT

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

# The chat workload with a third of its KV per replica: every pod evicts all the time, and
# behind several gateways each index credits pods with prefixes they lost. Run only through
# cache_aware with and without the pods' cache reports (the `eviction` section).
WORKLOADS["evicting"] = {
    **WORKLOADS["chat"],
    "capacity": 20_000,
    "quick_capacity": 15_000,
    "why": "the chat workload with a third of its KV per replica (20k tokens against ~150k of live "
           "sessions): pods evict constantly, and the index keeps crediting them with what they lost "
           "unless their own cache reports correct it (`feedback`).",
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
# Routers run only by their own sections.
EXTRA_ROUTERS = {
    "warmroute_cache_aware_no_feedback": {"filter_overrides": {
        "strategy": "cache_aware", "metrics": SCALED_METRICS, "feedback": {"enabled": False}}},
    # Replicas of one gateway that pull each other's placements (deploy/envoy/envoy-peers.yaml);
    # with one gateway it routes as warmroute_cache_aware does.
    "warmroute_cache_aware_peers": {"config_file": ROOT / "deploy" / "envoy" / "envoy-peers.yaml",
                                    "filter_overrides": {"strategy": "cache_aware", "metrics": SCALED_METRICS}},
}
# The peers (issue #34): other projects' routers, each one process on 127.0.0.1 in front of the
# same sims (bench/peers.py starts and stops it), from PyPI at the versions pinned in
# bench/peers-requirements.txt, installed by `make peers-setup` into .venv-peers. `args` are the
# routing flags on top of the bench's own (address, workers, metrics port on loopback): none is
# the router's defaults. The tuned rows are each project's documented recommendation for these
# workloads; `why` quotes it. `workloads` limits a row to the workloads its setting is
# documented for. Every other setting is the router's default, wall-clock ones included (unlike
# warmroute's scrape period, nothing of theirs needs compressing: their cache-aware policies
# count their own in-flight requests and never ask the pods, and their tree eviction runs every
# 60-120 s, longer than a run, on a tree far under its size bound).
PEER_ROUTERS: dict[str, dict] = {
    "sglang_router": {
        "exe": "sglang-router", "cmd": ["launch"], "args": [], "log_level": "info",
        "why": "SGLang router (sglang-router 0.3.2) at its defaults: policy cache_aware, cache-threshold 0.3, "
               "balance-abs-threshold 64, balance-rel-threshold 1.5.",
    },
    "sglang_router_tuned": {
        "exe": "sglang-router", "cmd": ["launch"], "args": ["--cache-threshold", "0.1"], "log_level": "info",
        "why": "the SGLang router's docs, Cache-Aware Routing, Tuning Guidelines (lightseekorg/smg "
               "docs/concepts/routing/cache-aware.md): cache-threshold 'Low (0.1-0.2): more cache hits ... "
               "Conversational workloads' (all four are); balance thresholds 'higher' for homogeneous workers, "
               "with no number given: left at their defaults, which the runs' loads (a few requests in flight "
               "per pod) never reach anyway.",
    },
    "vllm_router": {
        "exe": "vllm-router", "cmd": [], "args": [], "log_level": "info",
        "why": "vLLM's router (vllm-router 0.1.17) at its defaults: policy cache_aware, cache-threshold 0.3, "
               "balance-abs-threshold 64, balance-rel-threshold 1.5. It asks a pod to render each prompt "
               "(/v1/chat/completions/render, 403 on a default vLLM 0.32, as from the sim) and then routes on "
               "the prompt's text.",
    },
    "vllm_router_tuned": {
        "exe": "vllm-router", "cmd": [],
        "args": ["--cache-threshold", "0.5", "--balance-abs-threshold", "32", "--balance-rel-threshold", "1.1"],
        "log_level": "info",
        "why": "vLLM's router docs, Load Balancing Policies, Cache Aware (vllm-project/router "
               "docs/load_balancing/README.md): its configuration example, cache-threshold 0.5, "
               "balance-abs-threshold 32, balance-rel-threshold 1.1 ('Repeated system prompts / few-shot').",
    },
    "vllm_router_consistent_hash": {
        "exe": "vllm-router", "cmd": [], "args": ["--policy", "consistent_hash"], "log_level": "info",
        "workloads": ["agent", "chat", "evicting"],
        "why": "the same page's Quick Reference: 'Chat applications with conversation history: "
               "consistent_hash', keyed on the X-Session-ID header (its recommended key), which the agent and "
               "chat workloads send; conversation and uniform send none, and there it would hash whole bodies.",
    },
}
PEER_DEFAULTS = ["sglang_router", "vllm_router"]
# The workloads the peers run on: every routing-quality workload, `evicting` through one gateway
# (a peer is one process; warmroute beside it is one Envoy too).
PEER_WORKLOADS = ["agent", "conversation", "chat", "uniform", "evicting"]
# Paired rounds: warmroute and every peer row on each workload per round, the order reversed
# every other round (the machine's speed drifts over minutes).
PEER_ROUNDS = 2

# Paired rounds of the eviction section (cache_aware with and without feedback), and its
# gateways: with one, the index sees every prompt the pods hold and predicts 97% of the
# tokens they report (one run), leaving feedback little to correct; three gateways in front
# of the same pods evict each other's prefixes unseen, as replicas of a real gateway do.
# 15 rounds: each round's TTFT ratios range over +-15% around a true value near 1.00, and
# the section's verdict is the median's 95% interval (report.py, `median_ci`, which says
# what losses 15 rounds can tell from none).
EVICTION_ROUNDS = 15
EVICTION_GATEWAYS = 3


# The pairs behind the targets nearest their limits, re-run by the `reruns` section.
RERUN_PAIRS = [("conversation", "reference_1_replica_3x", 1),
               ("conversation", "envoy_round_robin", 1), ("conversation", "warmroute_cache_aware", 1),
               ("uniform", "envoy_least_request", 1), ("uniform", "warmroute_cache_aware", 1),
               ("agent", "warmroute_cache_aware", 1), ("agent", "warmroute_cache_aware", 3),
               ("conversation", "warmroute_cache_aware", 3),
               ("chat", "warmroute_cache_aware", 1), ("chat", "warmroute_cache_aware", 3)]
RERUNS = 2


# ------------------------------------------------------------------ trace analysis (why the capacity)

def lru_hit_rate(capacity_tokens: int, limit: int) -> float:
    """Block-level LRU prefix-cache hit rate of one cache over the first `limit` trace lines."""
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


# ------------------------------------------------------------------ mixed priority classes at overload

# Interactive chat and long batch jobs on a fleet past its capacity, through cache_aware without
# and with the priority gate (bench/mixed.py). The sizes are the first guess; `why` explains them.
MIXED_SEQS = 8
MIXED = {
    "args": ["mixed", "--interactive", "220", "--rate", str(1.5 * TIME_SCALE),
             "--interactive-start-ms", str(10000 / TIME_SCALE), "--system-tokens", "1000", "--user-tokens", "100",
             "--output-tokens", "150", "--batch-workers", str(6 * MIXED_SEQS), "--batch-jobs", "12",
             "--batch-prompt-tokens", "3000", "--batch-output-tokens", "400"],
    "quick": ["mixed", "--interactive", "100", "--rate", str(1.5 * TIME_SCALE),
              "--interactive-start-ms", str(10000 / TIME_SCALE), "--system-tokens", "1000", "--user-tokens", "100",
              "--output-tokens", "150", "--batch-workers", str(6 * MIXED_SEQS), "--batch-jobs", "6",
              "--batch-prompt-tokens", "3000", "--batch-output-tokens", "400"],
    "capacity": 200_000,
    "sim": ["--max-num-seqs", str(MIXED_SEQS)],
    "gate": {"knee": {"requests": MIXED_SEQS}},
    "why": "interactive chat beside long batch jobs on a fleet past its capacity. Each replica runs at most "
           f"{MIXED_SEQS} sequences (`--max-num-seqs {MIXED_SEQS}`: a large model's batch at 3-4k-token contexts), "
           f"{3 * MIXED_SEQS} in the fleet. {6 * MIXED_SEQS} closed-loop batch workers (twice the fleet's slots) "
           "send 12 jobs each back to back: unique 3000-token prompts, 400-token outputs (document summaries), "
           "so without the gate cache_aware spreads them and about "
           f"{MIXED_SEQS} batch jobs wait in each sim's FIFO queue, ahead of any chat that arrives. Interactive: "
           "1.5 chats/s (Poisson, from 1 s on, after the batch has filled the fleet), a shared 1000-token system "
           "prompt, ~100-token user messages, 150-token replies: about an eighth of the output tokens. With the "
           f"gate, `knee.requests` = {MIXED_SEQS} = `--max-num-seqs`: a pod is sent what it runs and no more, so "
           "the pods run full batches at their knee, and the excess waits in Envoy, where interactive leaves "
           "first (one release in ten goes to batch while chats wait: `lower_share` 0.1, the default).",
}
MIXED_ROUNDS = 3
