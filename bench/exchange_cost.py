"""What the exchange between gateway replicas costs as replicas are added (issue #33).

    cd bench && flock /tmp/warmroute-heavy.lock ../.venv/bin/python exchange_cost.py --rounds 2

The same offered load (the `uniform` workload: 2,000-token prompts at a fixed rate) through 1, 3
and 8 replicas of one gateway with the exchange on (deploy/envoy/envoy-peers.yaml), on fresh
fleets, the replica counts in an order that rotates each round. Per run: the replicas' Envoy
CPU summed, per answered request; the bytes the peers' pulls carried (Envoy's
`cluster.warmroute-peers.upstream_cx_rx_bytes_total`, summed over replicas), per request; and
each replica's resident memory at the end (its median over replicas). Ratios to one replica
are taken within a round. The machine has 2 cores: 8 Envoys share them, so CPU per request
there includes what 8 idle Envoys cost (their ticks, scrapes and pulls) at this load.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from measure import loadgen, proc_cpu_s
from scenarios import SCALED_METRICS, WORKLOADS, sim_args
from warmroute_harness import ROOT, Fleet

PEERS = ROOT / "deploy" / "envoy" / "envoy-peers.yaml"


def run(n: int, logdir: Path) -> dict:
    w = WORKLOADS["uniform"]
    overrides = {"strategy": "cache_aware", "metrics": SCALED_METRICS}
    with Fleet(3, sim_args(w["capacity"]), gateways=n, config_file=PEERS, logdir=logdir,
               filter_overrides=overrides) as f:
        cpu0 = [proc_cpu_s(e.proc.pid) for e in f.envoys]
        rep = loadgen(w["args"], [f"http://127.0.0.1:{e.port}" for e in f.envoys],
                      [f"http://{s.address}" for s in f.sims], logdir / "report.json", 150.0)
        cpu = sum(proc_cpu_s(e.proc.pid) for e in f.envoys) - sum(cpu0)
        rx = sum(e.stat("cluster.warmroute-peers.upstream_cx_rx_bytes_total") for e in f.envoys)
        rss = statistics.median(e.rss_bytes() for e in f.envoys)
        imported = sum(e.counter("warmroute.peers.events_imported") for e in f.envoys)
    ok = max(rep.get("ok") or 0, 1)
    return {"replicas": n, "ok": ok, "cpu_ms_per_req": cpu / ok * 1e3, "peer_bytes_per_req": rx / ok,
            "rss_mib": rss / 2**20, "imported": imported, "hit_rate": rep.get("hit_rate")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--replicas", nargs="+", type=int, default=[1, 3, 8])
    a = ap.parse_args()
    logdir = Path(tempfile.mkdtemp(prefix="warmroute-exchange-cost-"))
    rows: list[dict] = []
    for i in range(a.rounds):
        order = a.replicas[i % len(a.replicas):] + a.replicas[:i % len(a.replicas)]
        for n in order:
            rdir = logdir / f"{i}-{n}"
            rdir.mkdir()
            row = {**run(n, rdir), "round": i}
            rows.append(row)
            print(f"  round {i} {n} replicas: {row['ok']} requests, Envoy CPU {row['cpu_ms_per_req']:.2f} ms/req, "
                  f"peer bytes {row['peer_bytes_per_req']:.0f}/req, RSS {row['rss_mib']:.1f} MiB per replica, "
                  f"imported {row['imported']}, hit {row['hit_rate']}", flush=True)
    print(f"\nmedians over {a.rounds} rounds, ratios to 1 replica within each round:")
    for n in a.replicas:
        mine = [r for r in rows if r["replicas"] == n]
        ones = {r["round"]: r for r in rows if r["replicas"] == a.replicas[0]}
        cpu_ratio = statistics.median(r["cpu_ms_per_req"] / ones[r["round"]]["cpu_ms_per_req"] for r in mine)
        rss_ratio = statistics.median(r["rss_mib"] / ones[r["round"]]["rss_mib"] for r in mine)
        print(f"  {n} replicas: CPU/req {cpu_ratio:.2f}x, RSS per replica {rss_ratio:.2f}x, peer bytes/req "
              f"{statistics.median(r['peer_bytes_per_req'] for r in mine):.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
