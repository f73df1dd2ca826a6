"""`make bench`: routing quality on real traces and the cost of the filter, through the real Envoy.

    cd bench && ../.venv/bin/python run.py [--profile fast|full] [--quick] [--only SECTION ...]

Profiles (bench/profiles.py): `fast` (`make bench`, about 32 minutes: 1903 s in the last timed run) runs every
section that feeds a target with fewer rounds, only the rows the targets read, and a run two
sections would both make once, and writes bench/results/;
`full` (`make bench-full`, the default of run.py) runs everything below and writes
bench/results/full/. --merge merges into the profile's own results only.

Sections (all by default): agent conversation chat uniform (routing quality, 3 replicas, every
router + the single-replica reference), independent (guidellm, installed from
bench/requirements.txt, on one hot shared prefix and on 40 prefixes, through warmroute and Envoy
round robin, three paired runs), scale8 (8 replicas), gateways (3 Envoys in front of one fleet),
reruns (the pairs behind the targets nearest their limits, twice more: those targets are medians
of three paired runs), overhead (filter cost vs no filter, the floor filter and the no-op
ext_proc picker of the Inference Extension's architecture, instant backend; `make bench-cost`
runs it alone), memory (100k distinct prefixes), decision (native decision-time curve,
bench/decision), eviction (cache_aware with and without the pods' cache reports on an evicting
fleet behind 3 gateways, 15 paired rounds), mixed (interactive chat + long batch jobs at
overload, cache_aware without and with the priority gate, 3 paired rounds, bench/mixed.py),
fleet (100 instant pods at 100 requests/s of 4k- and 100k-token prompts, warmroute against a
no-filter Envoy in paired rounds, then the same traffic at 1, 2, 4, 8 workers, bench/fleet.py),
peers (the SGLang router and vLLM's router at their defaults and documented settings beside
warmroute on every routing-quality workload, paired rounds, bench/peers.py; `make peers-setup`
installs them; about 11 minutes a round), scale_midway (a gateway of one replica gains two
mid-run, with and without the exchange between replicas, 2 paired rounds, bench/scale_midway.py),
peer_faults (3 replicas with the exchange: a peer killed, one answering garbage, one too slow,
against no fault and no exchange, 2 rounds, bench/peer_faults.py), scale_out (1 gateway, 3, 3
with the exchange on every workload, 2 paired rounds, bench/scale_out.py), exchange_cost (1, 3
and 8 replicas with and without the exchange at one load, bench/exchange_cost.py), tail (the
conversation trace's TTFT P95 against the single-replica reference, 5 paired rounds pooled,
bench/tail_vs_reference.py), oracle (an oracle router that reads each sim's actual cache and
queue beside warmroute on every routing-quality workload, 3 paired rounds, bench/oracle.py;
about 4 minutes a round). A full run takes about two and a half hours on 2 cores (the peers
about 30 minutes at 3 rounds, the independent section about 15, eviction about 14, scale_out
about 10, oracle about 11, peer_faults about 8, tail about 6, fleet about 6, scale_midway about 5).

Writes latest.json, latest.md, latest.png, and decision.png (the decision-time curves, for the
docs' results page) into the profile's folder. Every server binds 127.0.0.1,
every load run is bounded by --max-requests/--max-seconds.

The pieces: scenarios.py (workloads, routers, time scale), quality.py (routing-quality runs),
overhead.py (filter cost, memory, decision time), extproc.py (the ext_proc gateway), measure.py
(load client, /proc), report.py (targets, markdown, plot). This file picks the sections, runs
them, merges with an earlier latest.json on --merge, and writes the results.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import fleet
import profiles
import independent
import oracle
import peers
import readme_results
import exchange_cost
import peer_faults
import scale_midway
import scale_out
import tail_vs_reference
from mixed import mixed
from overhead import decision_curve, memory, overhead
from quality import Bench, row_key
from report import decision_plot, markdown, mixed_targets, plot, print_targets, targets
from scenarios import WORKLOADS, lru_hit_rate
from warmroute_harness import LOADGEN_BIN, SIM_BIN, WASM, envoy_binary

# The figures every run and --report-only draw from the results.
FIGURES = ((plot, "latest.png"), (decision_plot, "decision.png"))

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"

SECTIONS = ["agent", "conversation", "chat", "uniform", "independent", "scale8", "gateways", "eviction", "reruns",
            "overhead", "memory", "decision", "mixed", "fleet", "peers", "scale_midway", "peer_faults",
            "scale_out", "exchange_cost", "tail", "oracle"]


def write_results(res: dict, out: Path) -> None:
    """Adds the targets to `res`, then writes latest.json and latest.md; the plot is the
    caller's, which may or may not tolerate its failure."""
    res["targets"] = (targets(res["quality"], res.get("overhead"), res.get("reruns"), res.get("independent"))
                      + mixed_targets(res.get("mixed")) + fleet.targets(res.get("fleet"))
                      + peers.targets(res.get("peers"))
                      + scale_midway.targets(res.get("scale_midway")) + peer_faults.targets(res.get("peer_faults"))
                      + scale_out.targets(res.get("scale_out")) + exchange_cost.targets(res.get("exchange_cost"))
                      + tail_vs_reference.targets(res.get("tail")) + oracle.targets(res.get("oracle")))
    (out / "latest.json").write_text(json.dumps(res, indent=1) + "\n")
    (out / "latest.md").write_text(markdown(res) + "\n".join(oracle.markdown(res.get("oracle"))))
    if out.resolve() == RESULTS:
        readme_results.README.write_text(readme_results.replaced(readme_results.README.read_text(),
                                                                 readme_results.render(res)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smoke run (< 3 min): fewer routers and requests")
    ap.add_argument("--only", nargs="+", choices=SECTIONS, help="run only these sections")
    ap.add_argument("--profile", choices=sorted(profiles.PROFILES), default="full",
                    help="fast: every target in fewer rounds, into bench/results/; full: everything, into "
                         "bench/results/full/ (bench/profiles.py)")
    ap.add_argument("--out", help="results directory (default: the profile's)")
    ap.add_argument("--merge", action="store_true",
                    help="keep the rows/sections of the existing latest.json that this run does not redo")
    ap.add_argument("--peer-rounds", type=int,
                    help=f"paired rounds of the peers section (default {peers.PEER_ROUNDS}, the profile's in fast)")
    ap.add_argument("--peer-workloads", nargs="+", choices=peers.PEER_WORKLOADS,
                    help="the peers section's workloads (default: all)")
    ap.add_argument("--oracle-rounds", type=int,
                    help=f"paired rounds of the oracle section (default {oracle.ORACLE_ROUNDS}, the profile's in fast)")
    ap.add_argument("--report-only", action="store_true",
                    help="re-render latest.md, latest.png, decision.png (and targets) from latest.json, "
                         "run nothing")
    a = ap.parse_args()
    prof = profiles.PROFILES[a.profile]
    # A quick run has a folder of its own: it must never stand in for either profile's results.
    a.out = a.out or str(RESULTS / ("quick" if a.quick else prof["out"]))
    if a.report_only:
        out = Path(a.out)
        res = json.loads((out / "latest.json").read_text())
        write_results(res, out)
        for draw, name in FIGURES:
            draw(res, out / name)
        return 0
    for p in (LOADGEN_BIN, SIM_BIN, WASM):
        if not p.exists():
            print(f"{p} missing: run `make build`", file=sys.stderr)
            return 1
    sections = a.only or (["agent", "conversation", "chat", "uniform", "gateways", "overhead", "decision"]
                          if a.quick else SECTIONS)
    if a.quick and not a.only:
        sections = ["agent", "conversation", "uniform", "gateways", "overhead", "decision"]
    if not a.only:
        sections = [s for s in sections if s not in prof["skip"]]
    # Each section's settings in this profile (none in `full`: the sections' own defaults).
    kw = {} if a.quick else prof["sections"]
    if a.merge and (Path(a.out) / "latest.json").exists():
        was = json.loads((Path(a.out) / "latest.json").read_text()).get("profile", "full")
        if was != a.profile:
            print(f"{a.out}/latest.json is a {was} run: not merging a {a.profile} run into it", file=sys.stderr)
            return 1
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    logdir = Path(tempfile.mkdtemp(prefix="warmroute-bench-"))
    print(f"logs: {logdir}", flush=True)
    b = Bench(a.quick, logdir)
    t0 = time.time()
    res: dict = {"quick": a.quick, "profile": a.profile, "section_s": {}, "started": time.strftime("%Y-%m-%d %H:%M:%S"), "sections": sections,
                 "machine": f"{os.cpu_count()} cores, {os.uname().machine}, Linux {os.uname().release}",
                 "envoy_version": subprocess.run([envoy_binary(), "--version"], capture_output=True,
                                                 text=True).stdout.strip().split("version:")[-1].strip()[:60]}
    ov = mem = dc = ind = None
    try:
        for s in sections:
            t_s, k = time.time(), kw.get(s, {})
            if s in WORKLOADS:
                b.workload_section(s, **k)
            elif s == "scale8":
                b.scale8()
            elif s == "gateways":
                b.gateways()
            elif s == "eviction":
                b.eviction(**k)
            elif s == "reruns":
                b.reruns_section()
            elif s == "overhead":
                ov = overhead(b, **k)
            elif s == "memory":
                mem = memory(b)
            elif s == "decision":
                dc = decision_curve(b)
            elif s == "mixed":
                res["mixed"] = mixed(b, **k)
            elif s == "independent":
                ind = independent.section(logdir, a.quick, **k)
            elif s == "fleet":
                res["fleet"] = fleet.section(logdir, a.quick, **k)
            elif s == "peers":
                res["peers"] = []
                k = {"rounds": peers.PEER_ROUNDS, **k}
                res["peers"] = peers.section(b, a.peer_rounds or k.pop("rounds"), a.peer_workloads, res["peers"], **k)
            elif s == "oracle":
                res["oracle"] = []
                k = {"rounds": a.oracle_rounds, **k} if a.oracle_rounds else k
                res["oracle"] = oracle.section(b, out=res["oracle"], **k)
            elif s == "scale_midway":
                res["scale_midway"] = scale_midway.section(logdir, a.quick, **k)
            elif s == "peer_faults":
                k = dict(k)
                if k.pop("reuse_warm", False):
                    # The scale-midway section's `warm` runs are this section's `on` (same fleet,
                    # front and load): their rows, where this run made them.
                    k["given_on"] = {r["workload"]: r["peer_fault_on"] for r in
                                     (res.get("scale_midway") or {}).get("rows", [])
                                     if r["setup"] == "warm" and r["round"] == 0 and "peer_fault_on" in r}
                res["peer_faults"] = peer_faults.section(logdir, a.quick, **k)
            elif s == "scale_out":
                k = dict(k)
                if k.pop("reuse_1g", False):
                    # One gateway's rows from what this run measured already: the main table's,
                    # and the peers section's (its warmroute row of `evicting`).
                    k["reuse_1g"] = [r for rnd in res.get("peers") or [] for r in rnd]
                res["scale_out"] = scale_out.section(b, a.quick, **k)
            elif s == "exchange_cost":
                res["exchange_cost"] = exchange_cost.section(logdir, a.quick, **k)
            elif s == "tail":
                res["tail"] = tail_vs_reference.section(b, a.quick, **k)
            res["section_s"][s] = round(time.time() - t_s)
            print(f"== {s}: {res['section_s'][s]} s", flush=True)
    finally:
        res.update({"quality": b.rows, "reruns": b.reruns, "overhead": ov, "memory": mem, "decision": dc,
                    "independent": ind, "wall_s": time.time() - t0})
        if a.merge and (out / "latest.json").exists():
            old = json.loads((out / "latest.json").read_text())
            new_keys = {row_key(r) for r in b.rows}
            res["quality"] = [r for r in old.get("quality", []) if row_key(r) not in new_keys] + b.rows
            order = {w: i for i, w in enumerate(WORKLOADS)}
            res["quality"].sort(key=lambda r: (r["replicas"] == 8, r["gateways"] > 1, order.get(r["workload"], 9)))
            # Re-runs merge like the rows: a section re-run alone (eviction) keeps the other
            # sections' re-runs, and no old re-run of a row this run measured (a run stopped
            # early, or one that re-ran a row without its re-runs, must not pool its rounds
            # with another build's).
            olds, news = old.get("reruns") or [], res["reruns"] or []
            redone = new_keys | {row_key(r) for rnd in news for r in rnd}
            merged = [[r for r in (olds[i] if i < len(olds) else []) if row_key(r) not in redone]
                      + (news[i] if i < len(news) else []) for i in range(max(len(olds), len(news)))]
            while merged and not merged[-1]:
                merged.pop()
            res["reruns"] = merged
            for k in ("overhead", "memory", "decision", "lru", "mixed", "independent", "fleet", "peers",
                      "scale_midway", "peer_faults", "scale_out", "exchange_cost", "tail", "oracle"):
                if res.get(k) is None and old.get(k) is not None:
                    res[k] = old[k]
            res["wall_s"] = old.get("wall_s", 0) + res["wall_s"]
            res["section_s"] = {**old.get("section_s", {}), **res["section_s"]}
            res["sections"] = sorted(set(old.get("sections", [])) | set(sections))
            res["quick"] = old.get("quick", a.quick)
        if "conversation" in sections:
            lim = int(WORKLOADS["conversation"]["quick" if a.quick else "args"][2])
            cap = WORKLOADS["conversation"]["quick_capacity" if a.quick else "capacity"]
            res["lru"] = {str(c): lru_hit_rate(c, lim) for c in sorted({400_000, cap, 3 * cap, 10**9})}
        write_results(res, out)
        for draw, name in FIGURES:
            try:
                draw(res, out / name)
            except Exception as e:  # a plot failure must not lose the measurements
                print(f"{name} failed: {e!r}", file=sys.stderr)
        wall = time.time() - t0
        print(f"\nwrote {out / 'latest.json'}, latest.md and the figures; {a.profile} profile, wall time "
              f"{wall:.0f} s ({wall / 60:.1f} min)")
        print_targets(res["targets"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
