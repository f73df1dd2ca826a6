#!/usr/bin/env python3
"""bench.py NAME ADMIN_PORT PID DYN(dynamic|static) [N_TIMED=20] [N_CPU=200]
For each candidate admin URL: response bytes, median/p90/max of curl time_total over N_TIMED
sequential calls (fresh connection each), and Envoy main-thread + whole-process CPU over N_CPU
calls on one keep-alive connection."""
import sys, subprocess, statistics, os, json, urllib.parse
name, port, pid, dyn = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
n_timed = int(sys.argv[5]) if len(sys.argv) > 5 else 20
n_cpu = int(sys.argv[6]) if len(sys.argv) > 6 else 200
only = sys.argv[7].split(",") if len(sys.argv) > 7 else None
q = lambda s: urllib.parse.quote(s, safe="")
POOL_RE = q(r"^outbound\|8000\|\|vllm\.llm\.svc\.cluster\.local$")
res = f"{dyn}_endpoint_configs"
cands = [
    ("clusters_json_filtered", f"/clusters?format=json&filter={POOL_RE}"),
    ("clusters_text_filtered", f"/clusters?filter={POOL_RE}"),
    ("eds_dump_filtered", f"/config_dump?include_eds&resource={res}&name_regex={POOL_RE}"),
    ("stats_membership_filtered", "/stats?filter=" + q(r"^cluster\.outbound\|8000\|\|vllm\.llm\.svc\.cluster\.local\.(membership_change|membership_total|membership_healthy)$")),
    ("clusters_json_all", "/clusters?format=json"),
    ("clusters_text_all", "/clusters"),
    ("eds_dump_all", f"/config_dump?include_eds&resource={res}"),
    ("config_dump_full_with_eds", "/config_dump?include_eds"),
    ("config_dump_name_regex_only", f"/config_dump?include_eds&name_regex={POOL_RE}"),
]
def cpu():
    def ticks(path):
        f = open(path).read().rsplit(")", 1)[1].split()
        return int(f[11]) + int(f[12])  # utime + stime (fields 14,15)
    return ticks(f"/proc/{pid}/task/{pid}/stat"), ticks(f"/proc/{pid}/stat")
hz = os.sysconf("SC_CLK_TCK")
out = []
for label, path in cands:
    if only and label not in only: continue
    url = f"http://127.0.0.1:{port}{path}"
    for _ in range(3):
        subprocess.run(["curl", "-s", "-o", "/dev/null", url], check=True)
    times, sizes, codes = [], set(), set()
    for _ in range(n_timed):
        r = subprocess.run(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code} %{size_download} %{time_total} %{time_starttransfer}", url], capture_output=True, text=True, check=True)
        c, s, t, ttfb = r.stdout.split()
        codes.add(c); sizes.add(int(s)); times.append(float(t) * 1000)
    times.sort()
    # CPU: n_cpu requests on one keep-alive connection (curl reuses it across URLs)
    m0, p0 = cpu()
    args = ["curl", "-s"]
    for _ in range(n_cpu):
        args += ["-o", "/dev/null", url]
    subprocess.run(args, check=True)
    m1, p1 = cpu()
    row = {"candidate": label, "path": path, "http": sorted(codes), "bytes": sorted(sizes),
           "median_ms": round(statistics.median(times), 2), "p90_ms": round(times[int(0.9 * len(times)) - 1], 2), "max_ms": round(times[-1], 2),
           "main_thread_cpu_ms_per_call": round((m1 - m0) * 1000 / hz / n_cpu, 3),
           "process_cpu_ms_per_call": round((p1 - p0) * 1000 / hz / n_cpu, 3), "n_timed": n_timed, "n_cpu": n_cpu}
    out.append(row)
    print(json.dumps(row), flush=True)
json.dump(out, open(os.environ.get("MEMBERSHIP_DIR", "/tmp/membership") + f"/out/bench-{name}.json", "w"), indent=1)
