"""The independent client: guidellm (PyPI, pinned in bench/requirements.txt) on two shapes
a new user tries first, through warmroute and Envoy round robin.

- `hot`: guidellm's own synthetic data, `prefix_tokens=1000,prompt_tokens=500`, 128 output
  tokens, concurrency 8: every request shares one 1000-token prefix (issue 17, section 3).
- `prefixes40`: 40 distinct 3000-word prefixes, each request one of them (uniformly at
  random, seeded) plus its own 500 words, 128 output tokens, concurrency 8, 240 requests:
  each prefix is used 6 times on average, so an ideal router hits 5/6 of 3000/3500 ~ 71%.
  The prefixes (120k tokens) exceed one replica's KV (100k) and fit the fleet's.

guidellm needs a Hugging Face tokenizer to build and count prompts, and this machine reaches
no model hub. `word_tokenizer` builds one offline, word-level, from the very text guidellm's
synthetic generator draws words from (the book shipped inside the guidellm package): one
token per word or punctuation mark, which is also how the simulated replicas count tokens,
so guidellm's token counts and the replicas' agree.

Each run starts a fresh fleet (cold caches), drives guidellm at `--rate-type concurrent`,
and keeps guidellm's TTFT figures with the replicas' own counters (hit rate, requests per
pod). The replicas run at time scale 1 here: guidellm is a Python client with per-request
overhead of its own, and at the bench's usual 10x its milliseconds would blur TTFT.
"""

from __future__ import annotations

import gzip
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

from quality import counters
from scenarios import ROUTERS
from warmroute_harness import Fleet

HERE = Path(__file__).resolve().parent
GUIDELLM = Path(sys.executable).parent / "guidellm"
# The replicas' KV capacity and speed in these runs (issue 17: 100k KV tokens each, real time).
CAPACITY = 100_000
SCALE = 1.0
CONCURRENCY = 8
# Output tokens per request; the fast profile may ask for fewer (bench/profiles.py says why).
OUTPUT_TOKENS = 128
SHAPES = {
    "hot": {"requests": 320,
            "why": "guidellm synthetic data prefix_tokens=1000,prompt_tokens=500, 128 output tokens, "
                   "concurrency 8, 320 requests: one prefix shared by every request. 320 rather than the "
                   "issue's ~160 so that P95 is not the first 8 requests (5% of 160), which start together "
                   "on cold caches where every router must prefill the prefix on each pod"},
    "prefixes40": {"requests": 240, "prefixes": 40, "prefix_words": 3000, "suffix_words": 500,
                   "why": "40 distinct 3000-word prefixes (one drawn per request) + 500 own words, 128 output "
                          "tokens, concurrency 8, 240 requests: ideal hit rate ~71%; the prefixes exceed one "
                          "replica's KV (100k tokens)"},
}
ROUTER_PAIR = ["envoy_round_robin", "warmroute_cache_aware"]
# At time scale 1 the filter's scrape settings are its defaults (see scenarios.SCALED_METRICS).
ROUTER_KWARGS = {"envoy_round_robin": ROUTERS["envoy_round_robin"],
                 "warmroute_cache_aware": {"filter_overrides": {"strategy": "cache_aware"}}}
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "HF_HUB_DISABLE_TELEMETRY": "1", "GUIDELLM__LOGGING__DISABLED": "true"}


def guidellm_text() -> str:
    """The text guidellm's synthetic generator takes its words from."""
    import guidellm  # noqa: PLC0415 (only the bench installs it)
    return gzip.decompress((Path(guidellm.__file__).parent / "data" / "prideandprejudice.txt.gz")
                           .read_bytes()).decode()


def word_tokenizer(out: Path) -> Path:
    """A word-level Hugging Face tokenizer (tokenizer.json + config) in `out`, built offline from
    guidellm's source text: words and punctuation marks split as the `Whitespace` pre-tokenizer
    does, each distinct piece one id, decoded joined by spaces (so decode then encode round-trips)."""
    from tokenizers import Tokenizer, models, pre_tokenizers  # noqa: PLC0415
    from transformers import PreTrainedTokenizerFast  # noqa: PLC0415

    pre = pre_tokenizers.Whitespace()
    vocab = {"[UNK]": 0}
    for piece, _ in pre.pre_tokenize_str(guidellm_text()):
        vocab.setdefault(piece, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre
    out.mkdir(parents=True, exist_ok=True)
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]").save_pretrained(str(out))
    return out


def prefixes_dataset(out: Path, shape: dict, seed: int = 17, output_tokens: int = OUTPUT_TOKENS) -> Path:
    """The 40-prefix shape as a JSONL file guidellm reads (`prompt`, token counts)."""
    words = guidellm_text().split()
    rng = random.Random(seed)

    def text(n: int) -> str:
        start = rng.randrange(len(words))
        return " ".join(words[(start + i) % len(words)] for i in range(n))

    prefixes = [text(shape["prefix_words"]) for _ in range(shape["prefixes"])]
    with out.open("w") as fh:
        for i in range(shape["requests"]):
            prompt = f"{rng.choice(prefixes)}\n\nRequest {i}: {text(shape['suffix_words'])}"
            fh.write(json.dumps({"prompt": prompt, "prompt_tokens_count": shape["prefix_words"] +
                                 shape["suffix_words"], "output_tokens_count": output_tokens}) + "\n")
    return out


def pod_requests(fleet: Fleet) -> list[int]:
    """Requests each replica finished, from its own counters."""
    return [int(s.metrics().get("vllm:request_success_total", 0)) for s in fleet.sims]


def guidellm_figures(report: Path) -> dict:
    """TTFT (ms) and throughput of the one benchmark in guidellm's JSON report."""
    b = json.loads(report.read_text())["benchmarks"][0]
    m = b["metrics"]
    ttft = m["time_to_first_token_ms"]["successful"]
    pct = ttft["percentiles"]
    rt = b["run_stats"]
    return {"ttft_ms": {"mean": ttft["mean"], "p50": ttft["median"], "p95": pct["p95"], "p99": pct["p99"]},
            "e2e_ms": {"mean": 1000 * m["request_latency"]["successful"]["mean"]},
            "throughput_rps": m["requests_per_second"]["successful"]["mean"],
            "ok": rt["requests_made"]["successful"], "errors": rt["requests_made"]["errored"]}


def run_shape(name: str, router: str, rdir: Path, tokenizer: Path, max_s: float = 300.0,
              output_tokens: int = OUTPUT_TOKENS) -> dict:
    """One guidellm run of shape `name` through `router` on a fresh 3-replica fleet."""
    shape = SHAPES[name]
    rdir.mkdir(parents=True, exist_ok=True)
    if name == "hot":
        data = f"prefix_tokens=1000,prompt_tokens=500,output_tokens={output_tokens},samples={shape['requests']}"
    else:
        data = str(prefixes_dataset(rdir / "prefixes40.jsonl", shape, output_tokens=output_tokens))
    sim = ["--time-scale", str(SCALE), "--kv-capacity-tokens", str(CAPACITY)]
    t0 = time.time()
    with Fleet(3, sim, logdir=rdir, **ROUTER_KWARGS[router]) as f:
        report = rdir / "guidellm.json"
        cmd = [str(GUIDELLM), "benchmark", "run", "--target", f"http://127.0.0.1:{f.envoy.port}",
               "--processor", str(tokenizer), "--data", data, "--rate-type", "concurrent",
               "--rate", str(CONCURRENCY), "--max-requests", str(shape["requests"]),
               "--max-seconds", str(max_s), "--random-seed", "42", "--disable-progress",
               "--output-path", str(report)]
        with open(rdir / "guidellm.log", "wb") as log:
            subprocess.run(cmd, check=True, stdout=log, stderr=subprocess.STDOUT, timeout=max_s + 120,
                           env={**os.environ, **OFFLINE})
        hits, queries = f.hit_counters()
        per_pod = pod_requests(f)
        dec = counters(f.envoys) if router != "envoy_round_robin" else {}
    row = {"workload": f"guidellm_{name}", "router": router, "replicas": 3, "gateways": 1,
           "kv_capacity_tokens": CAPACITY, "time_scale": SCALE, "client": "guidellm 0.3.1",
           "output_tokens": output_tokens,
           "hit_rate": hits / queries if queries else None, "per_pod_requests": per_pod, "decisions": dec,
           **guidellm_figures(report), "runtime_s": round(time.time() - t0, 1)}
    print(f"  guidellm {name:10s} {router:24s} hit {row['hit_rate']:.3f}  pods {per_pod}  ttft mean "
          f"{row['ttft_ms']['mean']:6.1f} p95 {row['ttft_ms']['p95']:6.1f} p99 {row['ttft_ms']['p99']:6.1f}"
          f"  err {row['errors']}  {dec}  ({row['runtime_s']:.0f}s)", flush=True)
    return row


def section(logdir: Path, quick: bool, runs: int = 3, output_tokens: dict[str, int] | None = None) -> dict:
    """Both shapes through both routers, `runs` times (1 when quick), the routers' order
    alternating between runs; targets are medians of the paired ratios (see report.py).
    `output_tokens` replaces a shape's 128 output tokens (shape -> tokens)."""
    tokens = {name: (output_tokens or {}).get(name, OUTPUT_TOKENS) for name in SHAPES}
    print(f"== independent client (guidellm), {runs if not quick else 1} paired run(s) per shape", flush=True)
    tokenizer = word_tokenizer(logdir / "word-tokenizer")
    out: dict = {"client": "guidellm 0.3.1", "concurrency": CONCURRENCY, "kv_capacity_tokens": CAPACITY,
                 "time_scale": SCALE, "shapes": {k: v["why"] for k, v in SHAPES.items()}, "runs": [],
                 "output_tokens": tokens}
    for i in range(1 if quick else runs):
        rows = []
        for name in SHAPES:
            for router in (ROUTER_PAIR if i % 2 == 0 else ROUTER_PAIR[::-1]):
                rows.append(run_shape(name, router, logdir / f"guidellm-{i + 1}-{name}-{router}", tokenizer,
                                      output_tokens=tokens[name]))
        out["runs"].append(rows)
    return out
