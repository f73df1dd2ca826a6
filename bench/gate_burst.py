"""How far past the knee a burst through several gateway replicas goes, with and without the
replicas sharing their in-flight work (issue #33).

    cd bench && flock /tmp/warmroute-heavy.lock ../.venv/bin/python gate_burst.py --rounds 3

Three simulated pods behind three Envoys with the gate on (`knee.requests` K per pod); a burst of
requests spread round robin over the gateways, all at once or over `--spread-s` seconds. Each pod's `vllm:num_requests_running`
is sampled every 20 ms while the burst runs; a run's figure is the highest count any pod
reached, against K. Rows: `deploy/envoy/envoy-peers.yaml` with the exchange on (the replicas'
in-flight work in every VM's load) and with it off (each gateway sees the others only through
its scrapes). Rounds alternate the order; the verdict is the median over rounds.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from warmroute_harness import MODEL, ROOT, Fleet, chat, post, words

PEERS = ROOT / "deploy" / "envoy" / "envoy-peers.yaml"


def burst(f: Fleet, n: int, max_tokens: int, spread_s: float) -> tuple[int, int, int]:
    """Sends `n` requests over the gateways, evenly over `spread_s` seconds; returns (highest running count on any
    pod, requests answered 200, requests shed 429)."""
    peak = [0]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            for s in f.sims:
                running = int(s.metrics().get("vllm:num_requests_running", 0))
                peak[0] = max(peak[0], running)
            time.sleep(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()

    start = time.monotonic()

    def one(i: int) -> int:
        time.sleep(max(0.0, start + spread_s * i / n - time.monotonic()))
        e = f.envoys[i % len(f.envoys)]
        body = chat(MODEL, [{"role": "user", "content": words(f"burst{i}-", 200)}], max_tokens=max_tokens)
        return post(e.port, "/v1/chat/completions", body, timeout=120).status

    with ThreadPoolExecutor(n) as pool:
        statuses = list(pool.map(one, range(n)))
    done.set()
    sampler.join()
    return peak[0], statuses.count(200), statuses.count(429)


def run(exchange: bool, knee: int, n: int, max_tokens: int, spread_s: float, logdir: Path) -> tuple[int, int, int]:
    overrides = {"gate": {"knee": {"requests": knee}}}
    if not exchange:
        overrides["peers"] = None
    # Sims decode at their own pace (time scale 1): a 64-token answer with a few others in the
    # batch lasts tens of milliseconds, so the burst overlaps.
    with Fleet(3, ["--decode-ms-per-seq", "20"], gateways=3, config_file=PEERS, logdir=logdir,
               filter_overrides=overrides) as f:
        for e in f.envoys:
            e.wait_ticks(3)
        return burst(f, n, max_tokens, spread_s)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--knee", type=int, default=4)
    ap.add_argument("--requests", type=int, default=90)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--spread-s", type=float, default=0.0, help="arrivals spread over this long (0: all at once)")
    a = ap.parse_args()
    logdir = Path(tempfile.mkdtemp(prefix="warmroute-gate-burst-"))
    peaks: dict[bool, list[int]] = {True: [], False: []}
    for i in range(a.rounds):
        for exchange in ([True, False] if i % 2 == 0 else [False, True]):
            rdir = logdir / f"{i}-{'on' if exchange else 'off'}"
            rdir.mkdir()
            peak, ok, shed = run(exchange, a.knee, a.requests, a.max_tokens, a.spread_s, rdir)
            peaks[exchange].append(peak)
            print(f"  round {i} exchange {'on ' if exchange else 'off'}: highest running on a pod {peak} "
                  f"(knee {a.knee}, {peak / a.knee:.2f}x); {ok} answered, {shed} shed", flush=True)
    for exchange in (True, False):
        med = statistics.median(peaks[exchange])
        print(f"exchange {'on ' if exchange else 'off'}: median peak {med} = {med / a.knee:.2f}x the knee "
              f"over {a.rounds} rounds ({peaks[exchange]})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
