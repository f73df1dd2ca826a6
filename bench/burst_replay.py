"""Replays the first requests of a recorded guidellm run through a fresh fleet, one at a time
per thread at the recorded start offsets (same prompts, same order, streamed), and prints
where each went and its time to first token. A diagnosis tool for the 40-prefix shape's
TTFT P99, which is guidellm's opening burst (`docs/decisions/0009-pending-prefix-is-no-hit.md`).

    cd bench && flock /tmp/warmroute-bench.lock env PYTHONPATH=<checkout>/harness \\
        ../.venv/bin/python burst_replay.py /tmp/warmroute-bench-XXXX/guidellm-1-prefixes40-warmroute_cache_aware \\
        --router warmroute_cache_aware --reps 3 [--wasm candidate.wasm]

The run directory is one the `independent` section leaves under its log folder (it holds
guidellm.json). Each rep starts its own 3 simulated replicas and Envoy, as the section does;
the burst starts 0.2 s after they answer, where guidellm starts a few seconds later (the
filter may not have scraped the pods yet; they are idle either way).
Prints, per rep, (prefix tag, replica, TTFT ms) for each request: the same tag is the same
3000-word prefix."""

from __future__ import annotations

import argparse
import http.client
import json
import shutil
import tempfile
import threading
import time
from pathlib import Path

from independent import CAPACITY, ROUTER_KWARGS, SCALE
from warmroute_harness.fleet import Fleet


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path, help="a guidellm run directory (holds guidellm.json)")
    ap.add_argument("--router", default="warmroute_cache_aware", choices=sorted(ROUTER_KWARGS))
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--requests", type=int, default=8, help="the first N requests (guidellm's concurrency)")
    ap.add_argument("--wasm", type=Path, help="a filter build to load (default: the checkout's dist/warmroute.wasm)")
    a = ap.parse_args()
    kwargs = dict(ROUTER_KWARGS[a.router])
    if a.wasm:
        if not a.wasm.is_file() or not kwargs.get("with_filter", True):
            raise SystemExit(f"burst_replay: --wasm {a.wasm}: no such file, or {a.router} loads no filter")
        kwargs["wasm_file"] = a.wasm.resolve()
    path = a.run / "guidellm.json"
    if not path.is_file():
        raise SystemExit(f"burst_replay: no {path} (a guidellm run directory of the `independent` section)")
    report = json.loads(path.read_text())
    reqs = sorted(report["benchmarks"][0]["requests"]["successful"], key=lambda r: r["start_time"])[:a.requests]
    if not reqs:
        raise SystemExit(f"burst_replay: {path} holds no successful request")
    t0 = reqs[0]["start_time"]
    tags: dict[str, int] = {}
    plan = [(r["start_time"] - t0, r["prompt"], tags.setdefault(r["prompt"][:200], len(tags))) for r in reqs]
    sim = ["--time-scale", str(SCALE), "--kv-capacity-tokens", str(CAPACITY)]
    for rep in range(a.reps):
        logdir = Path(tempfile.mkdtemp(prefix="warmroute-burst-"))
        with Fleet(3, sim, logdir=logdir, **kwargs) as f:
            out: list = [None] * len(plan)
            start = time.time() + 0.2

            def send(i: int) -> None:
                offset, prompt, tag = plan[i]
                time.sleep(max(0.0, start + offset - time.time()))
                c = http.client.HTTPConnection("127.0.0.1", f.envoy.port, timeout=60)
                try:
                    t = time.time()
                    c.request("POST", "/v1/completions", body=json.dumps(
                        {"model": "sim-llama-8b", "prompt": prompt, "max_tokens": 128, "stream": True}),
                        headers={"content-type": "application/json"})
                    r = c.getresponse()
                    r.read1(1)
                    ttft = (time.time() - t) * 1000
                    r.read()
                    out[i] = (tag, r.getheader("x-sim-replica") if r.status == 200 else f"HTTP {r.status}",
                              round(ttft))
                except OSError as e:
                    out[i] = (tag, f"failed: {e}", None)
                finally:
                    c.close()

            threads = [threading.Thread(target=send, args=(i,)) for i in range(len(plan))]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        shutil.rmtree(logdir, ignore_errors=True)
        ttfts = [o[2] for o in out if o and o[2] is not None]
        print(f"rep {rep}: max {max(ttfts, default=None)} ms  {out}", flush=True)


if __name__ == "__main__":
    main()
