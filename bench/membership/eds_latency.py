#!/usr/bin/env python3
"""Change the pool EDS file and poll admin until the change shows; print latency.
usage: eds_latency.py NAME ADMIN_PORT N_START TRIALS"""
import sys, time, subprocess, urllib.request, json
name, port, n0, trials = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
def count_clusters():
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/clusters?format=json&filter=%5Epool%24") as r:
        d = json.load(r)
    hs = d["cluster_statuses"][0].get("host_statuses", [])
    return len(hs), sum(1 for h in hs if h.get("health_status", {}).get("eds_health_status") == "UNHEALTHY")
def count_dump():
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/config_dump?include_eds&resource=static_endpoint_configs&name_regex=%5Epool%24") as r:
        d = json.load(r)
    eps = d["configs"][0]["endpoint_config"]["endpoints"]
    return sum(len(l.get("lb_endpoints", [])) for l in eps)
from set_pool import set_pool  # noqa: E402  (beside this script)
res = []
for t in range(trials):
    n = n0 + 1 if t % 2 == 0 else n0
    bad = [0] if t % 2 == 0 else []
    t0 = time.monotonic()
    set_pool(name, n, bad)
    t1 = time.monotonic()
    polls = 0
    while True:
        polls += 1
        c, u = count_clusters()
        if c == n and u == len(bad):
            break
        if time.monotonic() - t1 > 10:
            print("TIMEOUT", c, u); break
        time.sleep(0.0005)
    t2 = time.monotonic()
    assert count_dump() == n
    res.append((t2 - t1) * 1000)
    print(f"trial {t}: n={n} unhealthy={bad} visible after {1000*(t2-t1):.1f} ms (write {1000*(t1-t0):.1f} ms, {polls} polls)")
    time.sleep(0.5)
res.sort(); print("median ms", res[len(res)//2], "max", res[-1])
