"""The fast profile's shared runs (bench/profiles.py): which already-measured row a section
takes instead of running it again, on rows as `Bench.quality` writes them."""

from pathlib import Path

import peer_faults
import scale_midway
import scale_out
import tail_vs_reference as tail
from quality import Bench, row_key
from scenarios import WORKLOADS


def row(workload, router, replicas=3, gateways=1, capacity=None, hit=0.5):
    return {"workload": workload, "router": router, "replicas": replicas, "gateways": gateways,
            "kv_capacity_tokens": capacity or WORKLOADS[workload]["capacity"], "hit_rate": hit}


def bench_with(rows, tmp_path: Path) -> Bench:
    b = Bench(quick=False, logdir=tmp_path)
    for r in rows:
        b.rows.append(r)
        b.records[row_key(r)] = tmp_path / f"{r['router']}.jsonl"
    return b


def test_tail_round_0_is_the_main_pair_only_when_both_rows_were_measured(tmp_path):
    ref = row("conversation", "reference_1_replica_3x", replicas=1, capacity=3 * 2_000_000, hit=0.18)
    ca = row("conversation", "warmroute_cache_aware", hit=0.19)
    # The 3-gateway and the 400k-KV rows of the same router are other measurements.
    others = [row("conversation", "warmroute_cache_aware", gateways=3, hit=0.1),
              row("conversation", "warmroute_cache_aware", capacity=400_000, hit=0.03)]
    assert tail.main_pair(bench_with([ca, *others], tmp_path), "conversation") is None
    pair = tail.main_pair(bench_with([*others, ref, ca], tmp_path), "conversation")
    assert pair[tail.PAIR[0]]["hit_rate"] == 0.18 and pair[tail.PAIR[1]]["hit_rate"] == 0.19
    assert pair[tail.PAIR[1]]["records"] == tmp_path / "warmroute_cache_aware.jsonl"
    assert all(r["reused"] for r in pair.values())


def test_scale_out_takes_one_gateways_row_from_the_main_table_or_the_peers_evicting_row(tmp_path):
    b = bench_with([row("agent", "warmroute_cache_aware", hit=0.86),
                    # the eviction section's rows: 3 gateways, not one
                    row("evicting", "warmroute_cache_aware", gateways=3, hit=0.6)], tmp_path)
    peers_rows = [row("evicting", "sglang_router", hit=0.5), row("evicting", "warmroute_cache_aware", hit=0.64)]
    assert scale_out.measured_1g(b, "agent", [])["hit_rate"] == 0.86
    assert scale_out.measured_1g(b, "evicting", []) is None
    assert scale_out.measured_1g(b, "evicting", peers_rows)["hit_rate"] == 0.64
    assert scale_out.measured_1g(b, "chat", peers_rows) is None


def test_scale_midways_warm_run_is_the_peer_fault_on_run():
    # The share holds only while both sections drive the same load for as long.
    for w in scale_midway.MIDWAY:
        assert peer_faults.FAULTS[w][0] == scale_midway.MIDWAY[w][0]
    assert peer_faults.MAX_S == scale_midway.MAX_S
