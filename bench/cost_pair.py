"""Paired rounds of several filter builds against the floor filter and a no-filter Envoy, at
one body size: which part of the filter's cost over the floor does a build remove?

    cd bench && flock /tmp/warmroute-bench.lock env PYTHONPATH=<checkout>/harness \
        ../.venv/bin/python cost_pair.py --words 110 --rounds 16 \
        --builds main=../dist/warmroute.wasm 'small=/tmp/x.wasm@{"index":{"max_blocks":4096}}'

A build is `name=path.wasm`, optionally `@{json}` merged into the filter's configuration. Each
round measures every gateway in an order that reverses each round: the p50 at one request in
flight (`--requests`) and the gateway's CPU per request at 32 in flight (`--load-requests`,
threads' schedstat). Prints per build the medians of the per-round differences to the floor
and the no-filter gateway, and the median CPU ratio to the floor. The overhead section
(`overhead.py`) measures the shipped build this way; this script is for builds with parts cut
out (bench/notes.md, session 16), whose patches are one-offs.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from statistics import median

from measure import loadgen, proc_cpu_s
from overhead import InstantBackend, build_floor_filter, uniform_args
from warmroute_harness import Envoy


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--builds", nargs="+", required=True, help="name=path.wasm[@{json config overrides}]")
    ap.add_argument("--words", type=int, default=110, help="prompt words: 110 ~ 1 KB body, 15000 ~ 128 KB")
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--requests", type=int, default=300, help="latency requests per gateway and round")
    ap.add_argument("--load-requests", type=int, default=2000, help="CPU requests per gateway and round (0: none)")
    a = ap.parse_args()
    d = Path(tempfile.mkdtemp(prefix="cost-pair-"))
    cfg = {"strategy": "cache_aware", "debug_header": False}
    per: dict[str, dict[str, list[float]]] = {}
    with InstantBackend(3, d) as be:
        gw = {"nofilter": Envoy(be.sims(), concurrency=1, with_filter=False, lb="round_robin"),
              "floor": Envoy(be.sims(), concurrency=1, filter_overrides=cfg, wasm_file=build_floor_filter())}
        for spec in a.builds:
            name, _, rest = spec.partition("=")
            path, _, extra = rest.partition("@")
            gw[name] = Envoy(be.sims(), concurrency=1, filter_overrides={**cfg, **json.loads(extra or "{}")},
                             wasm_file=Path(path).resolve())
        per = {g: {"p50": [], "cpu": []} for g in gw}
        for e in gw.values():
            e.start(d)
        try:
            for g, e in gw.items():  # warm-up (connections, VM, index)
                loadgen(uniform_args(a.words, 100, 99), [f"http://127.0.0.1:{e.port}"], [], d / f"{g}-warm.json", 60,
                        ["--concurrency", "1"])
            names = list(gw)
            for r in range(a.rounds):
                for g in (names if r % 2 == 0 else names[::-1]):
                    e = gw[g]
                    target = [f"http://127.0.0.1:{e.port}"]
                    lat = loadgen(uniform_args(a.words, a.requests, 1 + r), target, [], d / f"{g}-{r}.json", 120,
                                  ["--concurrency", "1"])
                    per[g]["p50"].append(lat["e2e_ms"]["p50"] * 1000)
                    if a.load_requests:
                        c0 = proc_cpu_s(e.proc.pid)
                        thr = loadgen(uniform_args(a.words, a.load_requests, 100 + r), target, [],
                                      d / f"{g}-{r}-load.json", 120, ["--concurrency", "32", "--threads", "1"])
                        per[g]["cpu"].append((proc_cpu_s(e.proc.pid) - c0) / max(thr["ok"], 1) * 1e6)
        finally:
            for e in gw.values():
                e.stop()
    print(f"{a.words} words, {a.rounds} rounds; logs in {d}")
    for g, m in per.items():
        added = median(b - x for x, b in zip(per["nofilter"]["p50"], m["p50"]))
        over = median(b - x for x, b in zip(per["floor"]["p50"], m["p50"]))
        cpu = (f"CPU/req {median(m['cpu']):6.1f} us, vs the floor x"
               f"{median(b / max(x, 1e-9) for x, b in zip(per['floor']['cpu'], m['cpu'])):.2f}") if m["cpu"] else ""
        print(f"  {g:14s} p50 {median(m['p50']):6.0f} us  added {added:6.1f} us  over the floor {over:6.1f} us  {cpu}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
