#!/usr/bin/env python3
"""Generate Envoy configs for the membership experiments.
usage: gen.py NAME ADMIN_PORT LISTEN_PORT N_OTHER_CLUSTERS OTHER_KIND(static|eds) POOL_N
"""
import sys, os, yaml, json
name, admin_port, listen_port, n_other, other_kind, pool_n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], int(sys.argv[6])
base = os.environ.get("MEMBERSHIP_DIR", "/tmp/membership") + f"/{name}"
edsdir = f"{base}/eds"
os.makedirs(edsdir, exist_ok=True)

def lb_endpoints(prefix, n, port=8000, meta=True):
    eps = []
    for i in range(n):
        ep = {"endpoint": {"address": {"socket_address": {"address": f"{prefix}.{i//250}.{i%250+1}", "port_value": port}}}}
        if meta:
            ep["metadata"] = {"filter_metadata": {"warmroute": {"pod": f"vllm-{i}", "kv_blocks": 4096}}}
        eps.append(ep)
    return eps

def cla(cluster_name, eps):
    return {"cluster_name": cluster_name, "endpoints": [{"locality": {"zone": "z1"}, "lb_endpoints": eps}]}

def write_eds(cluster_name, eps):
    path = f"{edsdir}/{cluster_name}.yaml"
    doc = {"resources": [dict({"@type": "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"}, **cla(cluster_name, eps))]}
    tmp = f"{edsdir}/.tmp-{cluster_name}.yaml"
    with open(tmp, "w") as f:
        yaml.safe_dump(doc, f)
    os.rename(tmp, path)
    return path

def eds_cluster(cluster_name, eps, d=None):
    global edsdir
    saved = edsdir
    if d: edsdir = d; os.makedirs(d, exist_ok=True)
    path = write_eds(cluster_name, eps)
    edsdir = saved
    d = d or edsdir
    return {"name": cluster_name, "type": "EDS", "connect_timeout": "1s",
            "eds_cluster_config": {"service_name": cluster_name, "eds_config": {"resource_api_version": "V3",
                "path_config_source": {"path": path, "watched_directory": {"path": d}}}}}

def static_cluster(cluster_name, eps):
    return {"name": cluster_name, "type": "STATIC", "connect_timeout": "1s", "load_assignment": cla(cluster_name, eps)}

clusters = []
# admin cluster: what a Wasm dispatch_http_call would name
clusters.append({"name": "envoy-admin", "type": "STATIC", "connect_timeout": "1s",
                 "load_assignment": cla("envoy-admin", [{"endpoint": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": admin_port}}}}])})
clusters.append(static_cluster("pool-static", lb_endpoints("10.1", pool_n)))
clusters.append(eds_cluster("pool", lb_endpoints("10.2", pool_n), d=f"{base}/eds-pool"))
for c in range(n_other):
    eps = lb_endpoints(f"10.{100 + c // 250}", 8, port=9000 + c % 250, meta=False)
    # distinct addresses per cluster
    for j, e in enumerate(eps):
        e["endpoint"]["address"]["socket_address"]["address"] = f"10.{100 + c // 250}.{c % 250}.{j+1}"
    nm = f"svc-{c:03d}.ns-{c%20}.svc.cluster.local"
    clusters.append(static_cluster(nm, eps) if other_kind == "static" else eds_cluster(nm, eps))

hcm = {"@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
       "stat_prefix": "ing",
       "route_config": {"virtual_hosts": [{"name": "all", "domains": ["*"], "routes": [
           # TEST ONLY: expose admin via a route to prove the cluster works (a callout uses the same cluster manager)
           {"match": {"prefix": "/"}, "route": {"cluster": "envoy-admin", "timeout": "5s"}}]}]},
       "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}]}
cfg = {
    "node": {"id": "gw-1", "cluster": "gateway"},
    "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": admin_port}}},
    "static_resources": {
        "listeners": [{"name": "l", "address": {"socket_address": {"address": "127.0.0.1", "port_value": listen_port}},
                       "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager", "typed_config": hcm}]}]}],
        "clusters": clusters},
}
with open(f"{base}/envoy.yaml", "w") as f:
    yaml.safe_dump(cfg, f, sort_keys=False)
print(f"{base}/envoy.yaml", len(clusters), "clusters")
