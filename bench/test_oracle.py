"""The oracle section's account of the gap (bench/oracle.py `analyse`), on records written as
`warmroute-loadgen --records` writes them with the oracle's probes."""

import json

from oracle import analyse


def pod(name, ttft, cached, held_blocks, running=0):
    return {"replica": name, "predicted_ttft_ms": ttft, "cached_tokens": cached, "held_blocks": held_blocks,
            "block_size": 16, "running": running, "waiting": 0, "predict_us": 5.0}


def rec(served, pick, pods, prompt=1000, cached=0, ttft=10.0):
    return {"outcome": "ok", "replica": served, "prompt_tokens": prompt, "cached_tokens": cached, "ttft_ms": ttft,
            "oracle": {"route_us": 400.0, "pick": pick, "pods": pods}}


def test_each_request_is_classed_by_where_the_oracle_pod_differs(tmp_path):
    recs = [
        # warmroute took the oracle's pod.
        rec("a", 0, [pod("a", 20, 800, 50), pod("b", 60, 0, 0)]),
        # The oracle's pod held 800 tokens, warmroute's never held any: placement.
        rec("b", 0, [pod("a", 20, 800, 50), pod("b", 60, 0, 0)]),
        # warmroute's pod held 60 blocks once but now 0: eviction (its index would still credit it).
        rec("b", 0, [pod("a", 20, 800, 50), pod("b", 60, 0, 60)]),
        # Same cached prefix, shorter queue on the oracle's pod: load.
        rec("b", 0, [pod("a", 20, 800, 50), pod("b", 45, 800, 50, running=4)]),
    ]
    path = tmp_path / "records.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    out = analyse(path, oracle_routes=False)
    gap = out["gap"]
    assert {k: v["requests"] for k, v in gap.items()} == {"same": 1, "placement": 1, "eviction": 1, "load": 1}
    assert gap["placement"]["tokens_lost"] == 800 and gap["eviction"]["tokens_lost"] == 800
    assert gap["load"]["tokens_lost"] == 0 and gap["load"]["ttft_ms_lost"] == 25
    assert gap["placement"]["hit_points_lost"] == 800 / 4000
    assert out["evicted_on_chosen"] == 1  # the evicted pod: held 60 blocks, holds none
    assert out["route_us_p50"] == 400.0
