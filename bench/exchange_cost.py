"""What the exchange between gateway replicas costs as replicas are added (issue #33).

    cd bench && flock /tmp/warmroute-heavy.lock ../.venv/bin/python exchange_cost.py --rounds 2

The same offered load (the `uniform` workload: 2,000-token prompts at a fixed rate) through 1, 3
and 8 replicas of one gateway (deploy/envoy/envoy-peers.yaml), with the exchange on, and for
3 and 8 also off (what the exchange itself costs, apart from running more Envoys), on fresh
fleets, in an order that rotates each round. Per run: the replicas' Envoy
CPU summed, per answered request; the bytes the peers' pulls carried (Envoy's
`cluster.warmroute-peers.upstream_cx_rx_bytes_total`, summed over replicas), per request; and
each replica's resident memory at the end (its median over replicas). Ratios to one replica
are taken within a round. The machine has 2 cores: 8 Envoys share them, so CPU per request
there includes what 8 idle Envoys cost (their ticks, scrapes and pulls) at this load. Also the
`exchange_cost` section of `bench/run.py`.

So the CPU is also split in two: each setup first idles for IDLE_S seconds (the replicas' fixed
cost in cores, what a replica costs with no traffic), and the CPU per request less that idle
rate over the load's duration is the marginal cost of a request (what grows with traffic).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from measure import loadgen, proc_cpu_s
from report import print_targets
from scenarios import SCALED_METRICS, WORKLOADS, sim_args
from warmroute_harness import ROOT, Fleet

PEERS = ROOT / "deploy" / "envoy" / "envoy-peers.yaml"
SETTLE_S = 2.0
IDLE_S = 8.0


def run(n: int, exchange: bool, logdir: Path) -> dict:
    w = WORKLOADS["uniform"]
    overrides = {"strategy": "cache_aware", "metrics": SCALED_METRICS, **({} if exchange else {"peers": None})}
    with Fleet(3, sim_args(w["capacity"]), gateways=n, config_file=PEERS, logdir=logdir,
               filter_overrides=overrides) as f:
        # The replicas' fixed cost (ticks, scrapes, pulls, Envoy's own timers) at no traffic,
        # after the first pulls and scrapes have settled.
        time.sleep(SETTLE_S)
        idle0, t0 = sum(proc_cpu_s(e.proc.pid) for e in f.envoys), time.monotonic()
        time.sleep(IDLE_S)
        idle_cores = (sum(proc_cpu_s(e.proc.pid) for e in f.envoys) - idle0) / (time.monotonic() - t0)
        cpu0, t0 = [proc_cpu_s(e.proc.pid) for e in f.envoys], time.monotonic()
        rep = loadgen(w["args"], [f"http://127.0.0.1:{e.port}" for e in f.envoys],
                      [f"http://{s.address}" for s in f.sims], logdir / "report.json", 150.0)
        cpu = sum(proc_cpu_s(e.proc.pid) for e in f.envoys) - sum(cpu0)
        load_s = time.monotonic() - t0
        rx = sum(e.stat("cluster.warmroute-peers.upstream_cx_rx_bytes_total") for e in f.envoys)
        rss = statistics.median(e.rss_bytes() for e in f.envoys)
        imported = sum(e.counter("warmroute.peers.events_imported") for e in f.envoys)
    ok = max(rep.get("ok") or 0, 1)
    return {"replicas": n, "exchange": exchange, "ok": ok, "cpu_ms_per_req": cpu / ok * 1e3,
            "idle_cores": idle_cores, "marginal_ms_per_req": max(cpu - idle_cores * load_s, 0.0) / ok * 1e3,
            "peer_bytes_per_req": rx / ok,
            "rss_mib": rss / 2**20, "imported": imported, "hit_rate": rep.get("hit_rate")}


SETUPS_REPLICAS = [1, 3, 8]
CPU_TARGET, RSS_TARGET = 1.15, 1.10


def rounds(n_rounds: int, replicas: list[int], logdir: Path, off: bool = True) -> list[dict]:
    """Every setup (each replica count with the exchange on, and above one also off unless
    `off` is False) per round, in an order that rotates each round."""
    rows: list[dict] = []
    setups = [(n, True) for n in replicas] + [(n, False) for n in replicas if n > 1 and off]
    for i in range(n_rounds):
        order = setups[i % len(setups):] + setups[:i % len(setups)]
        for n, exchange in order:
            rdir = logdir / f"{i}-{n}-{'on' if exchange else 'off'}"
            rdir.mkdir(parents=True)
            row = {**run(n, exchange, rdir), "round": i}
            rows.append(row)
            print(f"  round {i} {n} replicas, exchange {'on ' if exchange else 'off'}: {row['ok']} requests, "
                  f"Envoy CPU {row['cpu_ms_per_req']:.2f} ms/req (idle {row['idle_cores']:.3f} cores, "
                  f"marginal {row['marginal_ms_per_req']:.2f} ms/req), peer bytes {row['peer_bytes_per_req']:.0f}/req, "
                  f"RSS {row['rss_mib']:.1f} MiB per replica, imported {row['imported']}", flush=True)
    return rows


def summary(rows: list[dict]) -> dict:
    """Medians over rounds of the within-round ratios to one replica (and, with the exchange on,
    to the same replicas without it)."""
    ones = {r["round"]: r for r in rows if r["replicas"] == 1 and r["exchange"]}
    out: dict = {"rounds": len({r["round"] for r in rows}), "setups": []}
    for n, exchange in dict.fromkeys((r["replicas"], r["exchange"]) for r in rows):
        mine = [r for r in rows if r["replicas"] == n and r["exchange"] == exchange and r["round"] in ones]
        if not mine:
            continue

        def ratio(key: str) -> float:
            return statistics.median(r[key] / max(ones[r["round"]][key], 1e-9) for r in mine)

        s = {"replicas": n, "exchange": exchange, "runs": len(mine), "cpu_ratio": ratio("cpu_ms_per_req"),
             "marginal_ratio": ratio("marginal_ms_per_req"), "rss_ratio": ratio("rss_mib"),
             "idle_cores_per_replica": statistics.median(r["idle_cores"] / n for r in mine),
             "peer_bytes_per_req": statistics.median(r["peer_bytes_per_req"] for r in mine)}
        off = {r["round"]: r for r in rows if r["replicas"] == n and not r["exchange"]}
        both = [r for r in mine if r["round"] in off]
        if exchange and n > 1 and both:
            s["cpu_vs_off"] = statistics.median(r["cpu_ms_per_req"] / off[r["round"]]["cpu_ms_per_req"] for r in both)
        out["setups"].append(s)
    return out


def report(s: dict) -> None:
    print(f"\nmedians over {s['rounds']} rounds; ratios within each round to 1 replica, and (exchange on) to "
          "the same replicas without it:")
    for m in s["setups"]:
        line = (f"  {m['replicas']} replicas, exchange {'on ' if m['exchange'] else 'off'}: CPU/req "
                f"{m['cpu_ratio']:.2f}x one replica (of which per request {m['marginal_ratio']:.2f}x; idle "
                f"{m['idle_cores_per_replica']:.3f} cores per replica), RSS per replica {m['rss_ratio']:.2f}x, "
                f"peer bytes/req {m['peer_bytes_per_req']:.0f}")
        if "cpu_vs_off" in m:
            line += f"; CPU/req {m['cpu_vs_off']:.2f}x the same replicas without the exchange"
        print(line)


def targets(s: dict | None) -> list[dict]:
    if not s:
        return []
    out = []
    for m in (m for m in s["setups"] if m["exchange"] and m["replicas"] > 1):
        n, runs = m["replicas"], f"median of {m['runs']} round(s)"
        vs_off = f"; {m['cpu_vs_off']:.2f}x the same replicas without the exchange" if "cpu_vs_off" in m else ""
        out.append({"target": f"exchange cost, {n} replicas: Envoy CPU per request vs 1 gateway",
                    "measured": f"{m['cpu_ratio']:.2f}x ({runs}; per request apart from idle "
                                f"{m['marginal_ratio']:.2f}x, idle {m['idle_cores_per_replica']:.3f} cores per "
                                f"replica{vs_off}; {n} Envoys on this machine's 2 cores)",
                    "limit": f"<= {CPU_TARGET:.2f}x", "result": "PASS" if m["cpu_ratio"] <= CPU_TARGET else "FAIL"})
        out.append({"target": f"exchange cost, {n} replicas: memory per replica vs 1 gateway (flat in N)",
                    "measured": f"{m['rss_ratio']:.2f}x ({runs})", "limit": f"<= {RSS_TARGET:.2f}x",
                    "result": "PASS" if m["rss_ratio"] <= RSS_TARGET else "FAIL"})
        out.append({"target": f"exchange cost, {n} replicas: peer bytes per request (information)",
                    "measured": f"{m['peer_bytes_per_req']:.0f} B ({runs})", "limit": "none", "result": "n/a"})
    return out


def section(logdir: Path, quick: bool, replicas: list[int] | None = None, off: bool = True) -> dict:
    """`make bench`'s section: one round of 1, 3 and 8 replicas (`replicas`; 1 and 3 when quick);
    without `off`, no run with the exchange off (its figure, CPU against the same replicas
    without the exchange, is a note beside the targets, which are against one replica)."""
    print("== exchange cost (1, 3, 8 replicas)", flush=True)
    s = summary(rounds(1, [1, 3] if quick else (replicas or SETUPS_REPLICAS), logdir / "exchange-cost", off))
    report(s)
    return s


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--replicas", nargs="+", type=int, default=SETUPS_REPLICAS)
    a = ap.parse_args()
    s = summary(rounds(a.rounds, a.replicas, Path(tempfile.mkdtemp(prefix="warmroute-exchange-cost-"))))
    report(s)
    print_targets(targets(s))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
