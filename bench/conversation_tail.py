"""Where the conversation trace's TTFT tail comes from, and how low a router could take it.

    cd bench && ../.venv/bin/python conversation_tail.py [RUN_DIR/records.jsonl ...] [--seeds 200]

For each run's `records.jsonl` (a `quality` or `pair.py` run of the `conversation` workload
leaves one in its log folder), the requests at or above the run's TTFT P95 are classed by
what the trace lets them reuse: *new* (an ideal cache holds under 10% of the prompt: the
leading run of its `hash_ids` seen in any earlier line), *warm, got it* (the pod reported at
least 0.8 of that) or *warm, lost it*. Their own prefill on an idle pod (the simulator's
step cost) is set beside the TTFT they had.

Then a fluid model of the same 800 lines on 3 pods, each a FIFO prefill server at the
simulator's full-budget rate (8192 tokens per 12 + 8192 x 0.06 ms step), wall ms at time
scale 10. Decode steps, KV capacity and chunk granularity are left out:

    ttft_r = max(free_p, t_r) + (len_r - cached_p(r)) / rate ;  free_p = t_r + ttft_r (sim ms)

- `home`: a prompt goes to the pod holding most of it, a new one (no more than the
  shared first block held anywhere) to the pod whose queue empties first: every backlog
  known exactly, cache unbounded;
- `home, unanswered`: the same, but a new prompt goes to the pod with the fewest tokens
  not yet answered (prompts count whole until their first token), as a router that sees
  only its own sends and first bytes weighs queues;
- `round robin`: Envoy's two workers each rotate on their own, so the pods a burst lands
  on depend on which worker takes each connection: modelled as a rotation that skips one
  pod with probability 1/2, over `--seeds` draws (their 10/50/90% quantiles);
- one pod of 3x speed: the bench's single-replica reference.
"""

from __future__ import annotations

import argparse
import json
import math
import random
from pathlib import Path

TRACE = Path(__file__).resolve().parent.parent.parent / "shared" / "traces" / "conversation_trace.jsonl"
LINES = 800                                  # the bench's `--limit`
BLOCK = 512                                  # tokens per trace block
SCALE = 10.0                                 # the bench's time scale
STEP_TOKENS, BASE_MS, PREFILL_MS = 8192, 12.0, 0.06   # the simulator's defaults
RATE = STEP_TOKENS / (BASE_MS + STEP_TOKENS * PREFILL_MS)


def pct(values: list[float], p: float) -> float:
    v = sorted(values)
    return v[min(len(v) - 1, int(round(p * (len(v) - 1))))]


def trace() -> list[dict]:
    with open(TRACE) as fh:
        return [json.loads(line) for _, line in zip(range(LINES), fh)]


def ideal_reuse(lines: list[dict]) -> list[int]:
    """Per line, the tokens an unbounded cache of every earlier line holds (leading blocks)."""
    seen: set[int] = set()
    out = []
    for r in lines:
        n = next((i for i, h in enumerate(r["hash_ids"]) if h not in seen), len(r["hash_ids"]))
        out.append(min(r["input_length"], n * BLOCK))
        seen.update(r["hash_ids"])
    return out


def own_prefill_ms(uncached: int) -> float:
    """Wall ms an idle pod takes to prefill `uncached` tokens (whole steps)."""
    steps = max(1, math.ceil(uncached / STEP_TOKENS))
    return (steps * BASE_MS + uncached * PREFILL_MS) / SCALE


def attribute(path: Path, reuse: list[int]) -> None:
    recs = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    recs = [r for r in recs if r.get("ttft_ms") is not None and r.get("prompt_tokens")]
    p95 = pct([r["ttft_ms"] for r in recs], 0.95)
    tail = [r for r in recs if r["ttft_ms"] >= p95]
    classes = {"new": 0, "warm, got it": 0, "warm, lost it": 0}
    for r in tail:
        share = reuse[int(r["session"].split("-")[1])] / r["prompt_tokens"]
        got = (r.get("cached_tokens") or 0) / r["prompt_tokens"]
        classes["new" if share < 0.1 else "warm, got it" if got >= 0.8 * share else "warm, lost it"] += 1
    own = [own_prefill_ms(r["prompt_tokens"] - (r.get("cached_tokens") or 0)) / r["ttft_ms"] for r in tail]
    print(f"{path.parent.name}: TTFT P95 {p95:.0f} ms; the {len(tail)} requests at or above it: "
          + ", ".join(f"{k} {v}" for k, v in classes.items())
          + f"; prompt tokens median {pct([r['prompt_tokens'] for r in tail], 0.5):.0f}"
          + f"; own prefill median {pct(own, 0.5):.2f} of their TTFT")


def model(lines: list[dict], pods: int, rate: float, pick) -> tuple[float, float]:
    """TTFT P95 (wall ms) and hit rate of one policy in the fluid model. `pick(cached, free,
    unanswered)` chooses a pod from what each holds of the prompt, when each one's queue empties,
    and the tokens each has been sent and not answered yet."""
    free = [0.0] * pods
    holds: list[set[int]] = [set() for _ in range(pods)]
    jobs: list[list[tuple[float, int]]] = [[] for _ in range(pods)]
    ttft, hit, total = [], 0, 0
    for r in lines:
        t, ids, length = r["timestamp"], r["hash_ids"], r["input_length"]
        cached = [min(length, BLOCK * next((i for i, h in enumerate(ids) if h not in holds[p]), len(ids)))
                  for p in range(pods)]
        unanswered = [sum(n for done, n in jobs[q] if done > t) for q in range(pods)]
        p = pick(cached, free, unanswered)
        done = max(free[p], t) + (length - cached[p]) / rate
        ttft.append((done - t) / SCALE)
        hit, total = hit + cached[p], total + length
        free[p] = done
        holds[p].update(ids)
        jobs[p].append((done, length - cached[p]))
    return pct(ttft, 0.95), hit / total


def home(by_unanswered: bool = False):
    """A prompt to the pod holding most of it; a new one to the shortest queue: the pod whose
    queue empties first, or with `by_unanswered` the one with the fewest tokens unanswered."""

    def pick(cached: list[int], free: list[float], unanswered: list[int]) -> int:
        best = max(range(len(cached)), key=lambda p: cached[p])
        queue = unanswered if by_unanswered else free
        return best if cached[best] > BLOCK else min(range(len(queue)), key=lambda p: queue[p])

    return pick


def round_robin(rng: random.Random):
    k = rng.randrange(3)

    def pick(cached: list[int], free: list[float], unanswered: list[int]) -> int:
        nonlocal k
        p = k % len(free)
        k += 1 + (rng.random() < 0.5)
        return p
    return pick


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("records", nargs="*", type=Path, help="records.jsonl of conversation runs")
    ap.add_argument("--seeds", type=int, default=200, help="round robin draws in the model")
    a = ap.parse_args()
    lines = trace()
    reuse = ideal_reuse(lines)
    for path in a.records:
        attribute(path, reuse)
    p95_home, hit_home = model(lines, 3, RATE, home())
    rr = sorted(model(lines, 3, RATE, round_robin(random.Random(s)))[0] for s in range(a.seeds))
    q = [pct(rr, p) for p in (0.1, 0.5, 0.9)]
    p95_ref, _ = model(lines, 1, 3 * RATE, home())
    p95_unanswered, _ = model(lines, 3, RATE, home(by_unanswered=True))
    print(f"model, 3 pods: home TTFT P95 {p95_home:.0f} ms (hit rate {hit_home:.3f}); round robin P95 "
          f"{q[0]:.0f} / {q[1]:.0f} / {q[2]:.0f} (10/50/90% of {a.seeds} draws), so home / round robin "
          f"{p95_home / q[2]:.2f} / {p95_home / q[1]:.2f} / {p95_home / q[0]:.2f}; one pod at 3x: {p95_ref:.0f}")
    print(f"model, 3 pods over one pod at 3x: home {p95_home / p95_ref:.2f}x; home placing new prompts by the "
          f"tokens not yet answered {p95_unanswered:.0f} ms, {p95_unanswered / p95_ref:.2f}x")


if __name__ == "__main__":
    main()
