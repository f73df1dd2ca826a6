"""The bench's profiles: which sections run and how many rounds each takes.

`full` (`make bench-full`) is every section at its own defaults: every router on every workload,
8 replicas, 15 eviction rounds, the re-runs, 3 guidellm runs, 3 peer rounds with the tuned
peers, the memory fill and the decision curve; about two hours on 2 cores, and its results go
to bench/results/full/.

`fast` (`make bench`) prints every target row of the full run, and writes bench/results/ (what
the docs and the README render). Its one timed run took 2015 s (33.6 minutes) on 2 cores
(2026-11-28), 101 s of which were the overhead section's cargo builds made from nothing (its
helper crates and the phase-timing filter); with those builds up to date (0.4 s) and the
fleet's cut below, about 1910 s (32 min), about 1930 s when the filter changed since the last
bench (its phase-timing build: 21 s). Timed again with those builds up to date (2026-11-28):
1903 s (31.7 minutes). That is over issue #34's 25 minutes: what is left to cut,
what each cut would cost, and the cuts tried and refused are in
docs/decisions/0024-bench-fast-profile.md.

Its rules: a workload stays the size it is in the full run, so each run of it is a draw from the
same distribution as the full run's; what goes is rounds, the rows no target reads, and runs
that repeat one this bench run has made already (the same router, fleet, workload and settings):
that run is made once and read by both sections, its row marked `reused` in the second. One
workload is sized down: guidellm's 40-prefix shape answers 32 tokens instead of 128 (three runs
of it against the full run's three: docs/decisions/0024-bench-fast-profile.md); the hot-prefix
shape keeps 128, because at 32 its TTFT P95 ratio left the full run's range in all three runs.
Per section (s, 2 cores; "timed" is the timed run of 2026-11-28, "now" the same less the cuts
measured since, each as docs/decisions/0024-bench-fast-profile.md says):

| section | fast | full | s timed | s now |
|---|---|---|---|---|
| agent, conversation | the reference, Envoy round robin, cache_aware | 9 routers | 20, 87 | |
| chat | cache_aware (the 3-gateway target's 1-gateway row) | 9 routers | 25 | |
| uniform | Envoy least request, cache_aware | 9 routers | 24 | |
| gateways | as full: 3 rows | | 68 | |
| eviction | 3 paired rounds | 15 | 160 | |
| reruns | none: each ratio is one run's | 2 more runs of 10 pairs | | |
| independent | 1 paired run, 40 prefixes at 32 output tokens | 3, 128 tokens | 223 | |
| overhead | as full: 8 paired rounds (at 4, two runs' CPU ratios at 128 KB differed by 0.3-0.45) | | 172 (101 of it builds from nothing) | 71 + builds: 0.4 up to date, 21 after a filter change |
| mixed | 1 paired round | 3 | 39 | |
| fleet | 1 paired round of 15 s, no worker-scaling table, both gateways' idle CPU over one window | 4, and the table | 52 | 47 |
| peers | 1 round, the peers at their defaults; warmroute's rows the main table's, but evicting's | 3 rounds, the tuned peers too | 236 | |
| scale_midway | 1 round of both workloads | 2 | 141 | |
| peer_faults | 1 round of both workloads; `on` is scale_midway's `warm` run (share 3) | 2 | 197 | |
| scale8, memory, decision | not run: no target reads them | | | |
| scale_out | 1 round, 1 gateway and 3 with the exchange; the 1-gateway rows are shared (share 2) | 2, and 3 without the exchange | 94 | |
| exchange_cost | 1 and 3 replicas with the exchange; none with it off (no target reads them: a note beside the CPU target) | 1, 3 and 8, on and off | 47 | |
| tail | 5 paired rounds (the target asks for 5), round 0 the main table's pair (share 1) | | 232 | |
| oracle | 1 paired round | 3 | 195 | |

(An empty "now" is the timed figure.) Their sum is 2012 s timed; now 1907 s with the builds up
to date, 1928 s after a filter change; run.py adds about 3 s (the report).

The shared runs, and why each is the run the second section would make:

1. `tail`'s round 0 is the main table's conversation reference and cache_aware rows
   (`tail_vs_reference.main_pair`): the same `Bench.quality` calls, the reference first as in an
   even round, with round robin's run between them (30 s) instead of none. The per-request TTFTs
   are read from the main rows' records.
2. `scale_out`'s one-gateway rows are the main table's cache_aware rows on agent, chat and
   conversation and the peers section's cache_aware row on evicting (`scale_out.measured_1g`):
   the same router, fleet and workload, measured 10-20 minutes before its 3-gateway row rather
   than just before it. The peers section takes the main table's rows the same way.
3. `peer_faults`' `on` run (3 replicas of the exchanging gateway behind the round-robin front,
   no fault) is `scale_midway`'s `warm` run: the same fleet, front, client arguments and bound
   (checked when the row is made, and by test_shared_runs.py), 1-2 minutes before the faults.

How each was checked is in docs/decisions/0024-bench-fast-profile.md.

What fewer rounds cost, per target: a target pooled over n paired runs in the full run is one
run's ratio here, and one run scatters as the full run's per-run values in latest.md show
(conversation TTFT P95 vs round robin 0.48-0.68, round robin's own P95 moving most). The
eviction verdict (no loss: the median's interval on the losing side) at 3 rounds is min-max
(75% coverage): it fails when all three rounds lose, which with no true difference happens
with probability p^3 per figure, p the share of losing rounds in the full run (hit rate 6/15,
TTFT mean 7/15, P95 4/15): 6%, 10%, 2%, so about one fast run in six fails one of the three
spuriously; `make bench-full`'s 15 rounds settle it.

A section not named here (one added later) runs at its own defaults in both profiles: give it
a cheaper setting here when it has one.
"""

from __future__ import annotations

from scenarios import PEER_DEFAULTS

# Per section: keyword arguments for the section's function in run.py; a section absent from
# `skip` and from the dict runs at its defaults.
PROFILES: dict[str, dict] = {
    "full": {"out": "full", "skip": [], "sections": {}},
    "fast": {
        "out": ".",
        "skip": ["scale8", "memory", "decision", "reruns"],
        "sections": {
            "agent": {"routers": ["envoy_round_robin", "warmroute_cache_aware"]},
            "conversation": {"routers": ["envoy_round_robin", "warmroute_cache_aware"]},
            "chat": {"routers": ["warmroute_cache_aware"], "reference": False},
            "uniform": {"routers": ["envoy_least_request", "warmroute_cache_aware"], "reference": False},
            "eviction": {"rounds": 3},
            "independent": {"runs": 1, "output_tokens": {"prefixes40": 32}},
            "mixed": {"rounds": 1},
            "fleet": {"rounds": 1, "workers": False},
            "peers": {"rounds": 1, "routers": PEER_DEFAULTS, "reuse_warmroute": True},
            "scale_midway": {"n": 1},
            "peer_faults": {"n": 1, "reuse_warm": True},
            "scale_out": {"n": 1, "setups": ["1g", "3g+peers"], "reuse_1g": True},
            "exchange_cost": {"replicas": [1, 3], "off": False},
            "tail": {"reuse_main": True},
            "oracle": {"rounds": 1},
        },
    },
}
