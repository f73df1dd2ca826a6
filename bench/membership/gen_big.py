#!/usr/bin/env python3
"""Istio-like gateway: 500 CDS clusters (EDS from files, 8 endpoints each) + a pool of 64.
usage: gen_big.py NAME ADMIN_PORT LISTEN_PORT N_OTHER POOL_N MODE   (MODE: cds | static)
 cds:    clusters come via CDS (file) -> added_via_api=true, like Istio; endpoints via EDS files
 static: 500 STATIC bootstrap clusters + pool EDS (bootstrap) from a file"""
import sys, os, yaml
name, admin_port, listen_port, n_other, pool_n, mode = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
base = os.environ.get("MEMBERSHIP_DIR", "/tmp/membership") + f"/{name}"
for d in ("eds", "eds-pool", "cds"): os.makedirs(f"{base}/{d}", exist_ok=True)
POOL = "outbound|8000||vllm.llm.svc.cluster.local"

def ep(addr, port, workload, ns, svc, zone):
    return {"endpoint": {"address": {"socket_address": {"address": addr, "port_value": port}}},
            "health_status": "HEALTHY",
            "metadata": {"filter_metadata": {
                "envoy.transport_socket_match": {"tlsMode": "istio"},
                "istio": {"workload": f"{workload};{ns};{svc};v1;Kubernetes"}}},
            "load_balancing_weight": 1}

def cla(cname, eps):
    return {"cluster_name": cname, "endpoints": [{"locality": {"region": "us-central1", "zone": "us-central1-a"}, "lb_endpoints": eps}]}

def write_atomic(path, doc):
    tmp = os.path.join(os.path.dirname(path), "." + os.path.basename(path) + ".tmp")
    with open(tmp, "w") as f: yaml.safe_dump(doc, f, sort_keys=False)
    os.rename(tmp, path)

def eds_file(d, cname, eps):
    fn = cname.replace("|", "_")
    path = f"{base}/{d}/{fn}.yaml"
    write_atomic(path, {"resources": [dict({"@type": "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"}, **cla(cname, eps))]})
    return path

def istio_like_cluster(cname, eds_path, watch_dir=None):
    pcs = {"path": eds_path}
    if watch_dir: pcs["watched_directory"] = {"path": watch_dir}
    return {"name": cname, "type": "EDS", "connect_timeout": "10s", "lb_policy": "LEAST_REQUEST",
            "eds_cluster_config": {"service_name": cname, "eds_config": {"resource_api_version": "V3", "path_config_source": pcs}},
            "circuit_breakers": {"thresholds": [{"max_connections": 4294967295, "max_pending_requests": 4294967295, "max_requests": 4294967295, "max_retries": 4294967295, "track_remaining": True}]},
            "common_lb_config": {"locality_weighted_lb_config": {}},
            "metadata": {"filter_metadata": {"istio": {"services": [{"host": cname.split("||")[1], "name": cname.split("||")[1].split(".")[0], "namespace": cname.split("||")[1].split(".")[1]}]}}}}

def pool_eps(n):
    return [ep(f"10.2.{i//250}.{i%250+1}", 8000, "vllm", "llm", "vllm", "a") for i in range(n)]

clusters = []
others = []
for c in range(n_other):
    ns, svc = f"ns-{c%20}", f"svc-{c:03d}"
    cname = f"outbound|{9000 + c % 7}||{svc}.{ns}.svc.cluster.local"
    eps = [ep(f"10.{100 + c // 250}.{c % 250}.{j+1}", 9000 + c % 7, f"{svc}-v1", ns, svc, "a") for j in range(8)]
    others.append((cname, eps))

admin_cluster = {"name": "envoy-admin", "type": "STATIC", "connect_timeout": "0.25s",
                 "load_assignment": {"cluster_name": "envoy-admin", "endpoints": [{"lb_endpoints": [{"endpoint": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": admin_port}}}}]}]}}
static_clusters = [admin_cluster]
pool_path = eds_file("eds-pool", POOL, pool_eps(pool_n))
pool_cluster = istio_like_cluster(POOL, pool_path, f"{base}/eds-pool")
if mode == "cds":
    def static_in_cds(cn, eps):
        c = istio_like_cluster(cn, "x"); del c["eds_cluster_config"]; c["type"] = "STATIC"; c["load_assignment"] = cla(cn, eps); return c
    # 500 path-based EDS subscriptions need 500 inotify instances (limit 128 here): the others
    # are STATIC clusters delivered over CDS; the host set the admin walks is the same.
    cds = [pool_cluster] + [static_in_cds(cn, eps) for cn, eps in others]
    write_atomic(f"{base}/cds/cds.yaml", {"resources": [dict({"@type": "type.googleapis.com/envoy.config.cluster.v3.Cluster"}, **c) for c in cds]})
else:
    static_clusters.append(pool_cluster)
    for cn, eps in others:
        static_clusters.append({"name": cn, "type": "STATIC", "connect_timeout": "10s", "load_assignment": cla(cn, eps)})

hcm = {"@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
       "stat_prefix": "ing",
       "route_config": {"virtual_hosts": [{"name": "all", "domains": ["*"], "routes": [
           {"match": {"prefix": "/"}, "route": {"cluster": "envoy-admin", "timeout": "5s"}}]}]},
       "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}]}
cfg = {"node": {"id": "gw-1", "cluster": "gateway"},
       "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": admin_port}}},
       "static_resources": {"listeners": [{"name": "l", "address": {"socket_address": {"address": "127.0.0.1", "port_value": listen_port}},
                       "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager", "typed_config": hcm}]}]}],
                            "clusters": static_clusters}}
if mode == "cds":
    cfg["dynamic_resources"] = {"cds_config": {"resource_api_version": "V3", "path_config_source": {"path": f"{base}/cds/cds.yaml", "watched_directory": {"path": f"{base}/cds"}}}}
with open(f"{base}/envoy.yaml", "w") as f: yaml.safe_dump(cfg, f, sort_keys=False)
print(base, mode, len(others) + 1, "pool/other clusters")
