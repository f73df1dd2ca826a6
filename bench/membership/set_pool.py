#!/usr/bin/env python3
"""Rewrite the pool EDS file atomically. usage: set_pool.py NAME N [unhealthy_index ...]"""
import os
import sys

import yaml


def set_pool(name: str, n: int, bad: set[int]) -> None:
    """n endpoints 10.2.x.y:8000 (those in `bad` UNHEALTHY) for pool `name`, in one rename."""
    d = os.environ.get("MEMBERSHIP_DIR", "/tmp/membership") + f"/{name}/eds-pool"
    eps = []
    for i in range(n):
        ep = {"endpoint": {"address": {"socket_address": {"address": f"10.2.{i//250}.{i%250+1}", "port_value": 8000}},
                           "hostname": f"vllm-{i}.pool.svc"},
              "metadata": {"filter_metadata": {"warmroute": {"pod": f"vllm-{i}", "kv_blocks": 4096}}}}
        if i in bad:
            ep["health_status"] = "UNHEALTHY"
        eps.append(ep)
    doc = {"resources": [{"@type": "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment",
                          "cluster_name": "pool", "endpoints": [{"locality": {"zone": "z1"}, "lb_endpoints": eps}]}]}
    tmp = f"{d}/.tmp"
    with open(tmp, "w") as f:
        yaml.safe_dump(doc, f)
    os.rename(tmp, f"{d}/pool.yaml")


if __name__ == "__main__":
    set_pool(sys.argv[1], int(sys.argv[2]), {int(x) for x in sys.argv[3:]})
