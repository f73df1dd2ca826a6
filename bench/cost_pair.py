"""Paired rounds of several filter builds against the floor filter and a no-filter Envoy, at
one body size: which part of the filter's cost over the floor does a build remove?

    cd bench && flock /tmp/warmroute-bench.lock env PYTHONPATH=<checkout>/harness \
        ../.venv/bin/python cost_pair.py --words 110 --rounds 16 \
        --builds main=../dist/warmroute.wasm 'small=/tmp/x.wasm@{"index":{"max_blocks":4096}}'

A build is `name=path.wasm`, optionally `@{json}` merged into the filter's configuration. The
rounds are the overhead section's own (`overhead.paired_rounds`: order reversing each round,
the p50 at one request in flight, CPU per request at 32 in flight). Prints per build the
medians of the per-round differences to the floor and the no-filter gateway, and the median
CPU ratio to the floor. The overhead section measures the shipped build this way; this script
is for builds with parts cut out (e.g. to weigh one step of the request path), whose patches are one-offs.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from statistics import median

from overhead import InstantBackend, build_floor_filter, paired_rounds
from warmroute_harness import Envoy


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--builds", nargs="+", required=True, help="name=path.wasm[@{json config overrides}]")
    ap.add_argument("--words", type=int, default=110, help="prompt words: 110 ~ 1 KB body, 15000 ~ 128 KB")
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--requests", type=int, default=300, help="latency requests per gateway and round")
    ap.add_argument("--load-requests", type=int, default=2000, help="CPU requests per gateway and round")
    a = ap.parse_args()
    d = Path(tempfile.mkdtemp(prefix="cost-pair-"))
    cfg = {"strategy": "cache_aware", "debug_header": False}
    with InstantBackend(3, d) as be:
        gw = {"nofilter": Envoy(be.sims(), concurrency=1, with_filter=False, lb="round_robin"),
              "floor": Envoy(be.sims(), concurrency=1, filter_overrides=cfg, wasm_file=build_floor_filter())}
        for spec in a.builds:
            name, _, rest = spec.partition("=")
            path, _, extra = rest.partition("@")
            gw[name] = Envoy(be.sims(), concurrency=1, filter_overrides={**cfg, **json.loads(extra or "{}")},
                             wasm_file=Path(path).resolve())
        per = paired_rounds(gw, a.words, a.rounds, a.requests, a.load_requests, d, f"{a.words}w")
    print(f"{a.words} words, {a.rounds} rounds; logs in {d}")
    for g, m in per.items():
        added = median((b - x) * 1000 for x, b in zip(per["nofilter"]["p50"], m["p50"]))
        over = median((b - x) * 1000 for x, b in zip(per["floor"]["p50"], m["p50"]))
        vs_floor = median(b / max(x, 1e-9) for x, b in zip(per["floor"]["cpu_load"], m["cpu_load"]))
        print(f"  {g:14s} p50 {median(m['p50']) * 1000:6.0f} us  added {added:6.1f} us  over the floor {over:6.1f} us  "
              f"CPU/req {median(m['cpu_load']):6.1f} us, vs the floor x{vs_floor:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
