"""The bench's profiles: which sections run and how many rounds each takes.

`full` (`make bench-full`) is every section at its own defaults: every router on every workload,
8 replicas, 15 eviction rounds, the re-runs, 3 guidellm runs, 3 peer rounds with the tuned
peers, the memory fill and the decision curve; about two hours on 2 cores, and its results go
to bench/results/full/.

`fast` (`make bench`) prints every target row of the full run in about 24 minutes on 2 cores (estimated from
the per-section times below; the last measured run, with two settings since taken back, 21.2)
without the scale_out, exchange_cost, tail and oracle sections, and about 39 with them (their runs'
lengths, not timed in this profile: over issue #34's 25 minutes), and writes bench/results/
(what the docs and the README render). Its rule: a workload stays the size it is in
the full run, so each run of it is a draw from the same distribution as the full run's; what
goes is rounds, and the rows no target reads. One workload is sized down: guidellm's 40-prefix
shape answers 32 tokens instead of 128 (three runs of it against the full run's three:
docs/decisions/0024-bench-fast-profile.md); the hot-prefix shape keeps 128, because at 32 its
TTFT P95 ratio left the full run's range in all three runs. Per section (s, 2 cores, 2026-11-27):

| section | fast | full | s (fast) |
|---|---|---|---|
| agent, conversation | the reference, Envoy round robin, cache_aware | 9 routers | 22, 89 |
| chat | cache_aware (the 3-gateway target's 1-gateway row) | 9 routers | 26 |
| uniform | Envoy least request, cache_aware | 9 routers | 24 |
| gateways | as full: 3 rows | | 75 |
| eviction | 3 paired rounds | 15 | 181 |
| reruns | none: each ratio is one run's | 2 more runs of 10 pairs | |
| independent | 1 paired run, 40 prefixes at 32 output tokens | 3, 128 tokens | ~225 (308 both at 128, 125 both at 32) |
| overhead | as full: 8 paired rounds (at 4, two runs' CPU ratios at 128 KB differed by 0.3-0.45) | | ~90 (40-51 at 4) |
| mixed | 1 paired round | 3 | 40 |
| fleet | 1 paired round of 15 s, no worker-scaling table | 4, and the table | 53 (86 at 2 rounds) |
| peers | 1 round, the peers at their defaults; warmroute's rows the main table's, but evicting's | 3 rounds, the tuned peers too | 238 (313 without the reuse) |
| scale_midway, peer_faults | 1 round of both workloads | 2 | 141, 249 |
| scale8, memory, decision | not run: no target reads them | | |
| scale_out | 1 round, 1 gateway and 3 with the exchange | 2, and 3 without it | not timed |
| exchange_cost | 1 and 3 replicas | 1, 3 and 8 | not timed |
| tail | as full: 5 paired rounds (the target asks for 5) | | not timed |
| oracle | 1 paired round | 3 | ~220 (one round of the full run's 11 min) |

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
            "peer_faults": {"n": 1},
            "scale_out": {"n": 1, "setups": ["1g", "3g+peers"]},
            "exchange_cost": {"replicas": [1, 3]},
            "oracle": {"rounds": 1},
        },
    },
}
