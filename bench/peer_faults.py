"""Faults in the exchange between gateway replicas: a peer killed midway, a peer answering
garbage, a peer answering too slowly, against no fault and against no exchange, in paired
rounds (issue #33).

    cd bench && flock /tmp/warmroute-heavy.lock ../.venv/bin/python peer_faults.py --rounds 2

Per round and workload, five runs on fresh fleets (3 sims, 3 replicas of
deploy/envoy/envoy-peers.yaml behind the round-robin front of front.py, one request in three
each), in an order that rotates each round:

- `off`: the exchange off (`peers` unset), no fault: the hit rate a fault must not fall below;
- `on`: the exchange on, no fault: the latency a fault must not raise;
- `kill`: the exchange on; at the time FAULTS sets after the client started, the front's slot of replica 2
  moves to replica 0 and replica 2 gets SIGKILL (a crash: its own in-flight requests die with
  it, which no exchange can save; they are counted apart). Its peers' pulls then fail, and the
  work it had in flight, which they hold as its share of their ledger, lapses;
- `garbage`: the exchange on, and in the peers cluster replica 2's peer port replaced by a
  server on 127.0.0.1 answering every pull 200 with bytes that are not a batch (random, half of
  them after the batch's magic); replica 2 still serves clients, so its placements are what
  the others lose;
- `slow`: the same with a server that holds every pull twice `peers.timeout_ms` (500 ms)
  before answering.

Figures per run: failed requests (the client's errors and aborts; in `kill`, apart from those
sent to replica 2 before the kill), TTFT and end-to-end P50/P99 of the successful requests, the
fleet's hit rate (the sims' prefix-cache counters). Within each round, each fault's P99s over
`on`'s and its hit rate over `off`'s; the verdict is the median over rounds. Targets: no
request fails; P99s unchanged within noise (≤ 1.10×: one run's P99 scatters about ±5% on
this machine, quality.py's re-runs, so a ratio of two ±10%); hit rate ≥ `off`'s. Each run is
bounded by the client's --max-seconds (150 s).
"""

from __future__ import annotations

import http.server
import json
import os
import signal
import statistics
import threading
import time
from pathlib import Path

import front
from front import Front, Load
from scenarios import SCALED_METRICS, TIME_SCALE, WORKLOADS, sim_args
from warmroute_harness import ROOT, Fleet

PEERS = ROOT / "deploy" / "envoy" / "envoy-peers.yaml"
MAX_S = 150.0
CASES = ["off", "on", "kill", "garbage", "slow"]
PEER_TIMEOUT_MS = 500  # peers.timeout_ms's default, which the bench keeps
P99_NOISE = 1.10
# Per workload: the client's arguments and when (s after it started) the fault comes, about a
# third into the run (conversation ~28 s; agent: 36 agents arriving every 200 ms, ~11 s).
FAULTS = {
    "conversation": (WORKLOADS["conversation"]["args"], 10.0),
    "agent": ([*WORKLOADS["agent"]["args"][:1], "--agents", "36",
               *WORKLOADS["agent"]["args"][3:-2], "--stagger-ms", str(2000 / TIME_SCALE)], 4.0),
}


class BadPeer(http.server.BaseHTTPRequestHandler):
    """A peer port whose every pull gets garbage (`slow`: after twice the pull's timeout)."""

    slow = False

    def do_GET(self):  # noqa: N802 (the stdlib's name)
        if self.slow:
            time.sleep(2 * PEER_TIMEOUT_MS / 1e3)
        junk = os.urandom(64 + int.from_bytes(os.urandom(2), "little") % 4096)
        body = (b"wrpx\x01" + junk) if junk[0] & 1 else junk
        try:
            self.send_response(200)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except OSError:  # the puller gave up (its timeout) and closed the connection
            pass

    def log_message(self, *args):
        pass


class SlowPeer(BadPeer):
    slow = True


def run(workload: str, case: str, logdir: Path) -> dict:
    args, fault_s = FAULTS[workload]
    overrides = {"strategy": "cache_aware", "metrics": SCALED_METRICS, **({"peers": None} if case == "off" else {})}
    f = Fleet(3, sim_args(WORKLOADS[workload]["capacity"]), gateways=3, config_file=PEERS, logdir=logdir,
              filter_overrides=overrides)
    bad = None
    if case in ("garbage", "slow"):
        bad = http.server.ThreadingHTTPServer(("127.0.0.1", 0), SlowPeer if case == "slow" else BadPeer)
        bad.daemon_threads = True
        threading.Thread(target=bad.serve_forever, daemon=True).start()
        ports = [e.peer_port for e in f.envoys]
        ports[2] = bad.server_address[1]
        for e in f.envoys:
            e.peer_ports = ports
    killed_ms = None
    try:
        with f, Front(3, logdir) as front:
            front.start([e.port for e in f.envoys])
            load = Load(args, front.ports, [f"http://{s.address}" for s in f.sims], logdir, MAX_S)
            try:
                if case == "kill":
                    load.sleep_until(fault_s)
                    front.point(2, f.envoys[0].port)
                    victim = f.envoys[2]
                    os.kill(victim.proc.pid, signal.SIGKILL)
                    killed_ms = time.time() * 1e3
                    victim.proc.wait(5)
                rep, recs = load.wait()
            finally:
                load.stop()
            counts = exchange_counts(f.envoys)
    finally:
        if bad:
            bad.shutdown()
            bad.server_close()
    return row_of(workload, case, rep, recs, counts, killed_ms)


def exchange_counts(envoys: list) -> dict:
    """The exchange's counters summed over the replicas still alive (`row_of` reads them)."""
    alive = [e for e in envoys if e.proc.poll() is None]
    return {"peers": {k: sum(e.stat(f"wasmcustom.warmroute.peers.{k}") for e in alive)
                      for k in ("events_imported", "pulls_failed", "events_dropped")},
            "host_errors": sum(e.stat("wasmcustom.warmroute.host_errors") for e in alive)}


def row_of(workload: str, case: str, rep: dict, recs: list[dict], counts: dict, killed_ms: float | None = None) -> dict:
    """One run's row from the client's report and records and the replicas' `exchange_counts`
    (scale_midway.py's `warm` run, the same fleet, front and load as `on`, makes one too)."""
    peers, host_errors = counts["peers"], counts["host_errors"]
    t0 = rep["started_unix_ms"]
    failed = [r for r in recs if r["outcome"] in ("error", "aborted")]
    # A request on the killed replica when it died (sent to its slot before the front moved).
    lost = [r for r in failed if killed_ms is not None and r["gateway"] == 2 and r["start_ms"] < killed_ms - t0]
    return {"workload": workload, "case": case, "ok": rep.get("ok"), "requests": rep.get("requests"),
            "failed": len(failed) - len(lost), "lost_with_killed": len(lost),
            "error_samples": rep.get("error_samples"), "hit_rate": rep.get("hit_rate"),
            "ttft_p50": (rep.get("ttft_ms") or {}).get("p50"), "ttft_p99": (rep.get("ttft_ms") or {}).get("p99"),
            "e2e_p50": (rep.get("e2e_ms") or {}).get("p50"), "e2e_p99": (rep.get("e2e_ms") or {}).get("p99"),
            "runtime_s": rep.get("runtime_s"), "peers": peers, "host_errors": host_errors,
            "killed_at_s": None if killed_ms is None else round((killed_ms - t0) / 1e3, 2)}


def rounds(n: int, workloads: list[str], logdir: Path, out: Path | None = None,
           given_on: dict[str, dict] | None = None) -> list[dict]:
    """`n` rounds of every case on each workload, the cases' order rotating. `given_on` (the
    fast profile): per workload, an `on` row this run made already (scale_midway.py's `warm`
    run: the same fleet, front and load), which round 0 takes instead of running `on`."""
    rows: list[dict] = []
    fh = open(out, "w") if out else None
    try:
        for i in range(n):
            order = CASES[i % len(CASES):] + CASES[:i % len(CASES)]
            for w in workloads:
                for case in order:
                    if i == 0 and case == "on" and w in (given_on or {}):
                        row = {**given_on[w], "round": i, "reused": True}
                        rows.append(row)
                        print(f"  round {i} {w:12s} {case:8s} the scale-midway section's warm run", flush=True)
                        continue
                    rdir = logdir / f"{i}-{w}-{case}"
                    rdir.mkdir(parents=True)
                    t = time.time()
                    row = {**run(w, case, rdir), "round": i, "wall_s": round(time.time() - t, 1)}
                    rows.append(row)
                    if fh:
                        fh.write(json.dumps(row) + "\n")
                        fh.flush()
                    print(f"  round {i} {w:12s} {case:8s} ok {row['ok']} failed {row['failed']}"
                          f"{'' if case != 'kill' else ' (+' + str(row['lost_with_killed']) + ' in flight on the killed)'}"
                          f"  ttft p50/p99 {row['ttft_p50']:.0f}/{row['ttft_p99']:.0f}"
                          f"  e2e p50/p99 {row['e2e_p50']:.0f}/{row['e2e_p99']:.0f}  hit {row['hit_rate']:.3f}"
                          f"  peers {row['peers']}  ({row['wall_s']} s)", flush=True)
    finally:
        if fh:
            fh.close()
    return rows


def summary(rows: list[dict]) -> dict:
    out: dict = {"rounds": len({r["round"] for r in rows}), "p99_noise": P99_NOISE, "rows": rows, "median": {}}
    for w in dict.fromkeys(r["workload"] for r in rows):
        by = {(r["case"], r["round"]): r for r in rows if r["workload"] == w}
        for case in CASES:
            mine = sorted((r for r in rows if r["workload"] == w and r["case"] == case), key=lambda r: r["round"])
            if not mine:
                continue
            m: dict = {"runs": len(mine), "failed": sum(r["failed"] for r in mine),
                       "lost_with_killed": sum(r["lost_with_killed"] for r in mine)}
            for k in ("ttft_p50", "ttft_p99", "e2e_p50", "e2e_p99", "hit_rate"):
                m[k] = statistics.median(r[k] or 0 for r in mine)
            for k in ("ttft_p99", "e2e_p99"):
                rs = [r[k] / by[("on", r["round"])][k] for r in mine if ("on", r["round"]) in by]
                m[f"{k}_vs_on"] = statistics.median(rs) if rs else None
            hs = [r["hit_rate"] / by[("off", r["round"])]["hit_rate"] for r in mine
                  if ("off", r["round"]) in by and by[("off", r["round"])]["hit_rate"]]
            m["hit_vs_off"] = statistics.median(hs) if hs else None
            if case in ("kill", "garbage", "slow"):
                m["met"] = {"no_failure": m["failed"] == 0,
                            "p99": all(x is not None and x <= P99_NOISE for x in (m["ttft_p99_vs_on"], m["e2e_p99_vs_on"])),
                            "hit": m["hit_vs_off"] is not None and m["hit_vs_off"] >= 1.0}
            out["median"][f"{w}/{case}"] = m
    return out


def _f(x: float | None, fmt: str = ".3f") -> str:
    return "n/a" if x is None else format(x, fmt)


def report(s: dict) -> None:
    print(f"\nmedians over {s['rounds']} rounds; P99 ratios to `on` and hit ratio to `off` taken within each round:")
    for k, m in s["median"].items():
        met = m.get("met")
        verdict = "" if not met else "  " + " ".join(f"{n}:{'MET' if v else 'NOT MET'}" for n, v in met.items())
        print(f"  {k:22s} failed {m['failed']}"
              f"{' (+' + str(m['lost_with_killed']) + ' lost in flight on the killed)' if m['lost_with_killed'] else ''}"
              f"  ttft p50/p99 {m['ttft_p50']:.0f}/{m['ttft_p99']:.0f} ms  e2e p50/p99 {m['e2e_p50']:.0f}/{m['e2e_p99']:.0f} ms"
              f"  hit {m['hit_rate']:.3f}  | p99 vs on: ttft {_f(m['ttft_p99_vs_on'])} e2e {_f(m['e2e_p99_vs_on'])}"
              f"  hit vs off {_f(m['hit_vs_off'])}  [{m['runs']} runs]{verdict}")


def targets(s: dict | None) -> list[dict]:
    if not s:
        return []
    out = []
    for k, m in s["median"].items():
        if "met" not in m:
            continue
        ok = all(m["met"].values())
        out.append({"target": f"peer fault {k}: no request fails, P99 TTFT/E2E within noise of no fault, hit rate "
                              "no worse than no exchange",
                    "measured": f"{m['failed']} failed; P99 TTFT {_f(m['ttft_p99_vs_on'])}x, E2E "
                                f"{_f(m['e2e_p99_vs_on'])}x no fault; hit {_f(m['hit_vs_off'])}x no exchange; "
                                f"median of {m['runs']} rounds",
                    "limit": f"0 failed, P99 <= {P99_NOISE}x, hit >= 1.0x", "result": "PASS" if ok else "FAIL"})
    return out


def section(logdir: Path, quick: bool, n: int = 2, given_on: dict[str, dict] | None = None) -> dict:
    """`make bench`'s section: `n` rounds of both workloads (1 of agent when quick), ~4 min a
    round; `given_on`, see `rounds`."""
    print("== peer faults (kill, garbage, slow)", flush=True)
    s = summary(rounds(1 if quick else n, ["agent"] if quick else ["conversation", "agent"], logdir / "peer-faults",
                       given_on=given_on))
    report(s)
    return s


def main() -> int:
    return front.main(__doc__, ["conversation", "agent"], list(FAULTS), "peer_faults", rounds, summary, report)


if __name__ == "__main__":
    raise SystemExit(main())
