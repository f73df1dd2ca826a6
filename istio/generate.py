#!/usr/bin/env python3
"""Generate warmroute's Istio objects for a vLLM Service.

Default (route.mode endpoint): nothing per pod. The filter follows the pods of
the Service itself: its pluginConfig names a `pool`, Istio's outbound cluster
for the Service (outbound|<port>||<fqdn>), and the filter's lease holder reads
that cluster's endpoints from the proxy's own admin at each tick, through the
warmroute-envoy-admin cluster added here. istiod keeps those endpoints current
(EDS from the Service's ready pods), so scaling the StatefulSet or Deployment,
or a pod moving, needs nothing regenerated.

--route-mode header --replicas N --pod-ips ...: the alternative, one vLLM pod
== one backend == one DestinationRule subset == one VirtualService header
match. It needs a StatefulSet (subsets select statefulset.kubernetes.io/
pod-name), and every scale-up, scale-down or pod move means re-running this
with the new count and IPs: a backend's address is where its scrapes go, and
a pod without a subset gets no requests.

Outputs (in --out, default istio/generated/):
  gateway.yaml                  the Gateway (listener for --external-host): Istio's,
                                on the pods --gateway-selector picks, or with
                                --gateway-api a gateway.networking.k8s.io one
  destinationrule.yaml          the Service's traffic policy; in header mode
                                one subset per pod as well
  virtualservice.yaml           the Gateway's route to the Service (bound to
                                the Gateway only); in header mode first the
                                x-warmroute-backend: exact <svc>-<i> -> subset
                                matches
  httproute.yaml                --gateway-api, instead of virtualservice.yaml:
                                the same route as an HTTPRoute on a
                                gateway.networking.k8s.io Gateway (gateway.yaml),
                                whose pods Istio labels gateway.networking.k8s.io/
                                gateway-name=<name>: the gateway objects select that
  virtualservice-mesh.yaml      header mode only: the same routes for the
                                client sidecar (gateways: [mesh]), exported to
                                the client's namespace only. In endpoint mode
                                Istio's own route for the Service is all the
                                sidecar needs (no timeout, Istio's default
                                retries: what virtualservice.yaml sets).
  pluginconfig.json             the full warmroute pluginConfig that the
                                WasmPlugin manifests embed
  envoyfilter-wasm-gateway.yaml the same plugin as an EnvoyFilter (ECDS ADD)
  envoyfilter-wasm-sidecar.yaml  with allow_on_headers_stop_iteration: true,
                                which WasmPlugin cannot express (does-not-work/)
  envoyfilter-routing-gateway.yaml  what the proxy running the filter needs
  envoyfilter-routing-sidecar.yaml  whichever form installs it: the body
                                buffer (request_body_buffer_limit), the strict
                                scrape cluster metrics.cluster names, in
                                endpoint mode the admin cluster the pool is
                                read through, the override_host policy on
                                the vLLM Service's cluster and the strip of
                                client routing headers
  peers.yaml                    --peer-port: the exchange between the gateway's replicas
                                (docs/deploy/istio.md, Several gateway replicas): a
                                headless Service selecting the gateway's pods on the
                                peer port, whose endpoints istiod sends the added
                                warmroute-peers cluster (EDS); the routing EnvoyFilter
                                adds that port to the gateway's listener and the
                                pluginConfig gets its `peers` section
  networkpolicy-peers.yaml      --peer-port: a NetworkPolicy admitting the peer port
                                from the gateway's own pods only (every other port as
                                before); for clusters whose CNI enforces NetworkPolicy
                                and where no other policy selects the gateway's pods
                                (with --peer-port the sidecar variant's files are not
                                written: the exchange is between gateway replicas)
  stats-tags-gateway.yaml       the filter's stats as Prometheus labels: a
  stats-tags-sidecar.yaml       ConfigMap in the proxies' namespace with a
                                bootstrap override (stats_config.stats_tags)
                                that istio-agent hands to Envoy, taken with
                                the pod annotation sidecar.istio.io/
                                bootstrapOverride: warmroute-stats-tags; with
                                --gateway-api the Gateway's deployment overlay
                                (its infrastructure.parametersRef) mounts it

Every EnvoyFilter selects the one workload where warmroute runs (the ingress
gateway, or the client app's sidecar) and patches only its context: no other
proxy in the mesh honours a routing header or carries these clusters.

The module: --image names the oci:// repository (and tag) the image was pushed to, --digest
the image's manifest digest, which deploy/oci/oci_artifact.py prints (make release). The generated
uri is oci://<image>@sha256:<digest> and the sha256 field the same digest: istio-agent
compares the image's manifest digest with it (pkg/wasm/cache.go), so a moved tag can never
swap the router's code. The .wasm file's own sha256 never matches there.

--config FILE: a JSON object merged over the generated pluginConfig (objects merge key by key,
anything else replaces), then checked by the filter's own parser (warmroute-check-config).
Keys this script wires to the Istio objects (pool, backends, route.mode, route.header,
metrics.cluster) are set by flags and refused there.

Python 3 standard library only (and, with --config, warmroute-check-config: $WARMROUTE_CHECK_CONFIG,
else target/release/warmroute-check-config, else cargo run). Deterministic output: re-running
with the same arguments (and --config file) gives byte-identical files (deploy/istio/check.sh
checks this with the command line recorded in each file's banner).

  python3 istio/generate.py --namespace llm --service vllm \
      --image oci://ghcr.io/you/warmroute:0.1.0 --digest sha256:<manifest digest>
"""

from __future__ import annotations

import argparse
import copy
import ipaddress
import json
import os
import re
import subprocess
import sys
import tempfile

HEADER = "x-warmroute-backend"
ENDPOINT_HEADER = "x-gateway-destination-endpoint"
# The request's model as the filter publishes it when route.model_header is set (the Gateway API
# Inference Extension's name): stripped from clients whether or not it is set.
MODEL_HEADER = "x-gateway-model-name"
# The gate's class and deadline headers (the filter's defaults for gate.header and
# gate.deadline_header) and the Inference Extension's objective, which the gate reads as a class.
GATE_HEADERS = {"header": "x-warmroute-priority", "deadline_header": "x-warmroute-deadline-ms"}
OBJECTIVE_HEADER = "x-gateway-inference-objective"
POD_NAME_LABEL = "statefulset.kubernetes.io/pod-name"
WASM_TYPE = "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm"
# The filter reads prompts up to this size; larger ones are routed by load and proxied as is.
MAX_BODY_BYTES = 8 * 1024 * 1024
# What one request may buffer on the proxy while the filter reads it. Istio leaves listeners at
# Envoy's 1 MiB, and one socket read (up to that + 16 KiB) lands on top of the up-to-
# MAX_BODY_BYTES the filter holds before it lets go, so this must be at least
# MAX_BODY_BYTES + 1 MiB + 16 KiB, or bodies just past MAX_BODY_BYTES get 413
# (deploy/istio/check.sh checks it). Set per virtual host, it leaves every other listener's
# buffers as they are.
REQUEST_BODY_BUFFER_LIMIT = 16 * 1024 * 1024
# The listener's per_connection_buffer_limit_bytes: Istio sets none, so Envoy's 1 MiB.
LISTENER_BUFFER_LIMIT = 1024 * 1024
RBAC_TYPE = "type.googleapis.com/envoy.extensions.filters.http.rbac.v3.RBAC"
# The scrape cluster the filter's metrics.cluster names, added to each proxy that runs the filter.
METRICS_CLUSTER = "warmroute-metrics"
# The cluster the filter reads the pool's endpoints through: the proxy's own admin interface.
ADMIN_CLUSTER = "warmroute-envoy-admin"
# Where Istio's bootstrap puts the proxy's admin (ProxyConfig proxyAdminPort, on localhost).
# Istio's bootstrap also has a cluster pointing there, prometheus_stats; it is internal to
# Istio and may change, so the routing EnvoyFilters add their own.
PROXY_ADMIN = ("127.0.0.1", 15000)
HCM = "envoy.filters.network.http_connection_manager"
HCM_TYPE = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
LB = "envoy.load_balancing_policies"
LB_TYPE = "type.googleapis.com/envoy.extensions.load_balancing_policies"


# --------------------------------------------------------------------------
# A tiny YAML emitter (block style) so the script needs no third-party module.
# --------------------------------------------------------------------------
_PLAIN = re.compile(r"^[A-Za-z0-9_./-][A-Za-z0-9_./:-]*$")
_RESERVED = {"true", "false", "yes", "no", "on", "off", "null", "y", "n", "~"}


def _scalar(v) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return json.dumps(v)
    s = str(v)
    if (
        _PLAIN.match(s)
        and s.lower() not in _RESERVED
        and not re.match(r"^[-+]?[0-9.]", s)
        and not s.endswith(":")
    ):
        return s
    return json.dumps(s)  # JSON strings are valid YAML double-quoted scalars


def to_yaml(v, indent: int = 0) -> str:
    pad = " " * indent
    out = []
    if isinstance(v, dict):
        if not v:
            return pad + "{}\n"
        for k, item in v.items():
            key = _scalar(k)
            if isinstance(item, str) and "\n" in item:
                out.append(f"{pad}{key}: |\n")
                for line in item.rstrip("\n").split("\n"):
                    out.append(f"{pad}  {line}\n" if line else "\n")
            elif isinstance(item, (dict, list)) and item:
                out.append(f"{pad}{key}:\n")
                out.append(to_yaml(item, indent + (2 if isinstance(item, dict) else 0)))
            else:
                out.append(f"{pad}{key}: {_scalar(item) if not isinstance(item, (dict, list)) else ('{}' if isinstance(item, dict) else '[]')}\n")
        return "".join(out)
    if isinstance(v, list):
        if not v:
            return pad + "[]\n"
        for item in v:
            if isinstance(item, dict) and item:
                body = to_yaml(item, indent + 2)
                out.append(f"{pad}- {body[indent + 2:]}")
            elif isinstance(item, list) and item:
                out.append(f"{pad}-\n{to_yaml(item, indent + 2)}")
            else:
                out.append(f"{pad}- {_scalar(item)}\n")
        return "".join(out)
    return pad + _scalar(v) + "\n"


def documents(objs) -> str:
    return "".join("---\n" + to_yaml(o) for o in objs)


# --------------------------------------------------------------------------
# Model
# --------------------------------------------------------------------------
def fqdn(service: str, namespace: str) -> str:
    return f"{service}.{namespace}.svc.cluster.local"


def cluster_name(service: str, namespace: str, port: int, subset: str = "") -> str:
    # Istio's outbound cluster naming: outbound|<port>|<subset>|<fqdn>
    return f"outbound|{port}|{subset}|{fqdn(service, namespace)}"


def backends(args) -> list[dict]:
    out = []
    for i, ip in enumerate(args.pod_ips):
        name = f"{args.service}-{i}"
        b = {
            "name": name,
            "address": f"{ip}:{args.port}",
            # Stable per-pod DNS from the StatefulSet's governing headless Service.
            "host": f"{name}.{args.headless_service}.{args.namespace}.svc.cluster.local:{args.port}",
        }
        b.update(serves(args))
        out.append(b)
    return out


def serves(args) -> dict:
    """What the pods serve, when told: the filter then answers a model none serves with 404."""
    out = {}
    if args.models:
        out["models"] = args.models
    if args.adapters:
        out["adapters"] = args.adapters
    return out


def pool(args) -> dict:
    return {
        # Istio's outbound cluster for the Service: the endpoints override_host routes among
        # (the override_host CLUSTER MERGE in envoyfilter-routing-*.yaml), which istiod keeps to the Service's ready pods.
        "cluster": cluster_name(args.service, args.namespace, args.port),
        "admin_cluster": ADMIN_CLUSTER,
        "max_backends": args.max_backends,
        # Spelled out even when empty (nothing declared: any model may go to any pod).
        "models": args.models,
        "adapters": args.adapters,
    }


def plugin_config(args) -> dict:
    route = {"mode": args.route_mode}
    if args.route_mode == "header":
        route["header"] = HEADER
    else:
        route["header"] = ENDPOINT_HEADER
        route["fallbacks"] = 2
    fleet = {"backends": backends(args)} if args.route_mode == "header" else {"pool": pool(args)}
    return {
        **fleet,
        "strategy": "cache_aware",
        "route": route,
        "block_bytes": 256,
        "max_body_bytes": MAX_BODY_BYTES,
        "session_header": "x-session-id",
        "balance": {"eps": 0.25},
        "cache_aware": {"tie_margin": 0.05, "min_match_blocks": 1, "prefill_slack_tokens": 8192},
        "saturation": {"max_waiting": 4, "max_kv_usage": 0.98, "max_inflight": 0},
        "index": {"max_blocks": 262144, "ttl_ms": 600000, "log_bytes": 262144},
        "metrics": {
            "enabled": True,
            # Not Istio's outbound cluster: its override_host policy falls back to round
            # robin, so a scrape of a stale address would be answered by another pod. The
            # strict cluster the routing EnvoyFilters add fails it instead.
            "cluster": METRICS_CLUSTER,
            "path": "/metrics",
            "period_ms": 500,
            "timeout_ms": 400,
            "unhealthy_after": 2,
            "stale_after_ms": 2000,
            "names": {
                "running": ["vllm:num_requests_running", "sglang:num_running_reqs"],
                "waiting": ["vllm:num_requests_waiting", "sglang:num_queue_reqs"],
                "kv_usage": ["vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "sglang:token_usage"],
            },
        },
        **({"peers": peers_config(args)} if getattr(args, "peer_port", None) else {}),
        "debug_header": False,
    }


def labels(args) -> dict:
    out = {"app.kubernetes.io/part-of": "warmroute", "app.kubernetes.io/managed-by": "warmroute-generate"}
    if args.revision:
        # Only the istiod of this revision reads the objects (pkg/config LabelsInRevision); an
        # object without the label is read by every revision.
        out["istio.io/rev"] = args.revision
    return out


# The Gateway's one listener (plain HTTP for the sample; terminate TLS there in production).
GATEWAY_PORT = 80
# The label Istio's Gateway API deployment puts on the pods of a gateway.networking.k8s.io Gateway
# (manifests/charts/istio-control/istio-discovery/files/kube-gateway.yaml).
GATEWAY_NAME_LABEL = "gateway.networking.k8s.io/gateway-name"

# ---- The exchange between the gateway's replicas (--peer-port)
# Each replica serves its recent index events on the peer port, and the VM holding the tick's lease
# pulls every replica's through the cluster peers.cluster names (filter/core/src/routing/
# exchange.rs). Its endpoints are the gateway's pods on the peer port: a headless Service selecting
# them, whose endpoints istiod sends by EDS under its outbound cluster name to whoever asks, as for
# warmroute-metrics (pilot/pkg/xds/endpoints/endpoint_builder.go findShards serves a headless,
# Passthrough, Service; only DNS ones are skipped).
PEERS_CLUSTER = "warmroute-peers"
PEERS_SERVICE = "warmroute-peers"
# The peer port is an additional address of the gateway's own HTTP listener (Envoy's listener
# additional_addresses, added by a LISTENER MERGE), not a Gateway server of its own:
#  - one listener, one filter chain, one Wasm filter: the peer path is answered by the plugin that
#    routes the clients' requests (same VM, same root context, same outbox). A second listener
#    would get a plugin of its own wherever its metadata differ: Envoy keys a plugin by name,
#    traffic direction and the listener's metadata (source/extensions/common/wasm/plugin.h,
#    createPluginKey), and proxy-wasm starts one root context per key (proxy-wasm-cpp-host
#    src/wasm.cc, WasmBase::start);
#  - no Service port: Istio's Service for a Gateway API Gateway carries every listener's port
#    (istio-discovery files/kube-gateway.yaml), so a listener on the peer port would face clients;
#    the added address is on no Service but the headless one.
# istiod merges the patch with proto.Merge, which appends to any address of its own
# (envoyfilter/listener_patch.go patchListener, util.go mergePatchValue); Envoy takes the changed
# listener on a running gateway as a modified listener, the old one draining (Envoy 1.37 and 1.40,
# tried on a file-driven LDS).
PEER_BIND = "0.0.0.0"
# Ports Istio's proxies use (istio.io, Application requirements, "Ports used by Istio").
ISTIO_PORTS = (15000, 15001, 15002, 15004, 15006, 15008, 15020, 15021, 15053, 15090)


def peers_config(args) -> dict:
    """The filter's `peers` section: the added cluster, the peer port, the admin it reads the
    cluster's endpoints through (the pool's own admin cluster)."""
    return {"cluster": PEERS_CLUSTER, "port": args.peer_port, "admin_cluster": ADMIN_CLUSTER}


def peers_service(name: str, namespace: str, selector: dict, port: int, meta_labels: dict,
                  annotations: dict | None = None) -> dict:
    """A headless Service selecting the gateway's pods on the peer port: their endpoints, and no
    virtual IP (nothing balances over the replicas: each pull names its replica)."""
    meta = {"name": name, "namespace": namespace, "labels": meta_labels}
    if annotations:
        meta["annotations"] = annotations
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta,
        "spec": {
            "clusterIP": "None",
            "selector": dict(selector),
            "ports": [{"name": "http-warmroute-peers", "port": port, "targetPort": port,
                       "protocol": "TCP", "appProtocol": "http"}],
        },
    }


def peers_network_policy(name: str, namespace: str, selector: dict, port: int, meta_labels: dict) -> dict:
    """The peer port from the gateway's own pods only; every other port as before.

    A pod that any NetworkPolicy selects admits only what some policy allows, so the first rule
    keeps every other TCP port (the clients' listeners, health and stats) and UDP (HTTP/3) open to
    all, and the second admits the peer port from the pods of this selector in this namespace.
    Policies add up: where another policy already selects the gateway's pods, the first rule would
    widen it; there, add the second rule to yours instead."""
    others = []
    if port > 1:
        others.append({"protocol": "TCP", "port": 1, "endPort": port - 1})
    if port < 65535:
        others.append({"protocol": "TCP", "port": port + 1, "endPort": 65535})
    others.append({"protocol": "UDP", "port": 1, "endPort": 65535})
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": name, "namespace": namespace, "labels": meta_labels},
        "spec": {
            "podSelector": {"matchLabels": dict(selector)},
            "policyTypes": ["Ingress"],
            "ingress": [
                {"ports": others},
                {"from": [{"podSelector": {"matchLabels": dict(selector)}}],
                 "ports": [{"protocol": "TCP", "port": port}]},
            ],
        },
    }


def peer_address(port: int) -> dict:
    """The listener's added address: the peer port on every interface of the pod."""
    return {"address": {"socket_address": {"address": PEER_BIND, "port_value": port}}}


def gateway(args) -> dict:
    """The Gateway: Istio's own (on the pods --gateway-selector picks) or, with --gateway-api, a
    gateway.networking.k8s.io one that Istio deploys (its pods carry only GATEWAY_NAME_LABEL)."""
    namespace, name = args.gateway.split("/", 1)
    if args.gateway_api:
        return {
            "apiVersion": "gateway.networking.k8s.io/v1",
            "kind": "Gateway",
            "metadata": {"name": name, "namespace": namespace, "labels": labels(args)},
            "spec": {
                "gatewayClassName": args.gateway_class,
                "listeners": [{
                    "name": "http",
                    "hostname": args.external_host,
                    "port": GATEWAY_PORT,
                    "protocol": "HTTP",
                    # Routes from the vLLM Service's namespace only.
                    "allowedRoutes": {"namespaces": {"from": "Selector", "selector": {
                        "matchLabels": {"kubernetes.io/metadata.name": args.namespace}}}},
                }],
                # The overlay that mounts the stats tags' bootstrap override (stats-tags-gateway.yaml).
                "infrastructure": {"parametersRef": {"group": "", "kind": "ConfigMap", "name": GATEWAY_PARAMS_CONFIGMAP}},
            },
        }
    return {
        "apiVersion": "networking.istio.io/v1",
        "kind": "Gateway",
        "metadata": {"name": name, "namespace": namespace, "labels": labels(args)},
        "spec": {
            "selector": dict(args.gateway_selector),
            # Plain HTTP on 80 for the sample; terminate TLS here in production (credentialName).
            "servers": [{"port": {"number": GATEWAY_PORT, "name": "http", "protocol": "HTTP"}, "hosts": [args.external_host]}],
        },
    }


def destination_rule(args) -> dict:
    spec = {
        "host": fqdn(args.service, args.namespace),
        "trafficPolicy": {
            # Where nothing picks the pod: clients of the Service whose proxy runs no warmroute,
            # and in header mode the default route (no header: the filter failed open, or a
            # non-LLM path). Where override_host is merged into the cluster it replaces this
            # (Envoy ignores lb_policy when load_balancing_policy is set).
            "loadBalancer": {"simple": "LEAST_REQUEST"},
            "connectionPool": {"http": {"idleTimeout": "300s"}},
        },
    }
    if args.route_mode == "header":
        spec["subsets"] = [
            {"name": f"{args.service}-{i}", "labels": {POD_NAME_LABEL: f"{args.service}-{i}"}}
            for i in range(args.replicas)
        ]
    return {
        "apiVersion": "networking.istio.io/v1",
        "kind": "DestinationRule",
        "metadata": {"name": args.service, "namespace": args.namespace, "labels": labels(args)},
        "spec": spec,
    }


def http_routes(args) -> list[dict]:
    host = fqdn(args.service, args.namespace)
    routes = []
    for i in range(args.replicas if args.route_mode == "header" else 0):
        name = f"{args.service}-{i}"
        routes.append(
            {
                "name": name,
                "match": [{"headers": {HEADER: {"exact": name}}}],
                "route": [{"destination": {"host": host, "subset": name, "port": {"number": args.port}}}],
                # Long generations: no route timeout (Istio's default is none, be explicit).
                "timeout": "0s",
            }
        )
    routes.append(
        {
            "name": "default",
            "route": [{"destination": {"host": host, "port": {"number": args.port}}}],
            "timeout": "0s",
        }
    )
    return routes


def virtual_service(args) -> dict:
    return {
        "apiVersion": "networking.istio.io/v1",
        "kind": "VirtualService",
        "metadata": {"name": args.service, "namespace": args.namespace, "labels": labels(args)},
        "spec": {
            "hosts": [args.external_host],
            # The Gateway only. In header mode, bound to `mesh` as well, every sidecar would send
            # a request carrying x-warmroute-backend to the pod it names, and only the proxies
            # running warmroute strip client copies of that header.
            "gateways": [args.gateway],
            "http": http_routes(args),
        },
    }


def http_route(args) -> dict:
    """--gateway-api: the Gateway's route to the Service (the VirtualService's, in Gateway API)."""
    namespace, name = args.gateway.split("/", 1)
    return {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "HTTPRoute",
        "metadata": {"name": args.service, "namespace": args.namespace, "labels": labels(args)},
        "spec": {
            # The Gateway only: no Service parentRef (a mesh route every sidecar would apply).
            "parentRefs": [{"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": name,
                            "namespace": namespace, "sectionName": "http"}],
            "hostnames": [args.external_host],
            "rules": [{
                "backendRefs": [{"name": args.service, "port": args.port}],
                # Long generations: no request timeout (0s disables it).
                "timeouts": {"request": "0s"},
            }],
        },
    }


def mesh_virtual_service(args) -> dict:
    """The header routes for the client sidecar that runs warmroute (header mode needs them there).

    exportTo limits them to the client's namespace, so no sidecar elsewhere lets a request pick
    its pod. Other workloads of that namespace still see them without the strip patch, which
    selects the client app only: run untrusted workloads elsewhere.
    """
    return {
        "apiVersion": "networking.istio.io/v1",
        "kind": "VirtualService",
        "metadata": {"name": f"{args.service}-mesh", "namespace": args.namespace, "labels": labels(args)},
        "spec": {
            "hosts": [fqdn(args.service, args.namespace)],
            "gateways": ["mesh"],
            "exportTo": [args.client_namespace],
            "http": http_routes(args),
        },
    }


# The filter's stats as Prometheus labels: Envoy's tag extraction turns the pod, the decision's
# reason, why a body was unread, the strategy, the outcome, the gate's class and the declared
# model in a stat's name into labels (the stats_config.stats_tags of every shipped Envoy config; e2e/test_observability
# compares the copies). A ProxyConfig cannot carry them: its extraStatTags only name tags of the
# form <name>=.=<value>;.; (Istio's tools/packaging/common/envoy_bootstrap.json), which the
# filter's stat names are not. A bootstrap override can: istio-agent hands the file named by
# $ISTIO_BOOTSTRAP_OVERRIDE to Envoy as --config-yaml (pkg/envoy/proxy.go), which Envoy merges
# over Istio's bootstrap, these tags appended to Istio's own; Istio's stats matcher keeps every
# wasm* stat (pkg/bootstrap/config.go requiredEnvoyStatsMatcherInclusionPrefixes).
STATS_TAGS = [
    {"tag_name": "pod", "regex": r"^wasmcustom\.warmroute\.backend\.((.+?)\.)\w+$"},
    {"tag_name": "reason", "regex": r"^wasmcustom\.warmroute\.(?:model\.)?decision(\.(\w+))(?:\..+)?$"},
    {"tag_name": "unread", "regex": r"^wasmcustom\.warmroute\.fallback(\.(\w+))$"},
    {"tag_name": "strategy", "regex": r"^wasmcustom\.warmroute\.requests\.((\w+)\.)\w+$"},
    {"tag_name": "outcome", "regex": r"^wasmcustom\.warmroute\.(?:requests\.\w+|scrape)(\.(\w+))$"},
    {"tag_name": "class", "regex": r"^wasmcustom\.warmroute\.gate\.((.+?)\.)\w+$"},
    {"tag_name": "model", "regex": r"^wasmcustom\.warmroute\.model\.(?:decision\.\w+|\w+)(\.(.+))$"},
]
STATS_CONFIGMAP = "warmroute-stats-tags"
# Where the sidecar and gateway injection templates mount the ConfigMap that the annotation
# sidecar.istio.io/bootstrapOverride names, and the file they point ISTIO_BOOTSTRAP_OVERRIDE at
# (istio-discovery files/injection-template.yaml, gateway-injection-template.yaml).
BOOTSTRAP_OVERRIDE_DIR = "/etc/istio/custom-bootstrap"
BOOTSTRAP_OVERRIDE_FILE = "custom_bootstrap.json"
BOOTSTRAP_OVERRIDE_ANNOTATION = "sidecar.istio.io/bootstrapOverride"
# A Gateway API gateway's Deployment is rendered from kube-gateway.yaml, which honours no such
# annotation; since Istio 1.26 its infrastructure.parametersRef names a ConfigMap whose
# `deployment` key is a strategic merge patch over that Deployment (gatewaycommon/
# deploymentcontroller.go applyOverlay), here the same mount and variable on istio-proxy.
GATEWAY_PARAMS_CONFIGMAP = "warmroute-gateway"
PROXY_CONTAINER = "istio-proxy"


def stats_bootstrap() -> str:
    """The bootstrap override: stats_config.stats_tags only, as JSON (what istio-agent reads)."""
    tags = ",\n".join("  " + json.dumps(t) for t in STATS_TAGS)
    return '{"stats_config": {"stats_tags": [\n' + tags + "\n]}}\n"


def stats_configmaps(args, where: str) -> list[dict]:
    """The bootstrap override in the namespace of the proxies `where` names; with --gateway-api,
    for the gateway, the parameters that mount it as well."""
    out = [{
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": STATS_CONFIGMAP, "namespace": workload(args, where)[0], "labels": labels(args)},
        "data": {BOOTSTRAP_OVERRIDE_FILE: stats_bootstrap()},
    }]
    if args.gateway_api and where == "gateway":
        overlay = {"spec": {"template": {"spec": {
            "containers": [{
                "name": PROXY_CONTAINER,
                "env": [{"name": "ISTIO_BOOTSTRAP_OVERRIDE", "value": f"{BOOTSTRAP_OVERRIDE_DIR}/{BOOTSTRAP_OVERRIDE_FILE}"}],
                "volumeMounts": [{"name": STATS_CONFIGMAP, "mountPath": BOOTSTRAP_OVERRIDE_DIR, "readOnly": True}],
            }],
            "volumes": [{"name": STATS_CONFIGMAP, "configMap": {"name": STATS_CONFIGMAP}}],
        }}}}
        out.append({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": GATEWAY_PARAMS_CONFIGMAP, "namespace": args.gateway_namespace, "labels": labels(args)},
            "data": {"deployment": to_yaml(overlay)},
        })
    return out


def stats_note(args, where: str) -> str:
    if where == "gateway" and args.gateway_api:
        how = "The Gateway's pods mount it through its infrastructure.parametersRef (Istio >= 1.26)."
    else:
        pods = "gateway's pods" if where == "gateway" else f"client app's pods ({args.client_namespace}/{args.client_app})"
        how = (f"The {pods} take it with the pod annotation\n"
               f"#   {BOOTSTRAP_OVERRIDE_ANNOTATION}: {STATS_CONFIGMAP}\n"
               "# (a Helm chart's podAnnotations), read when the pod starts.")
    return (
        "# The filter's stats as Prometheus labels: Envoy's stats_tags, merged over Istio's bootstrap\n"
        f"# by istio-agent. {how}\n"
    )


def workload(args, where: str) -> tuple[str, dict, str]:
    """(namespace, selector labels, patch context) of the proxy that runs warmroute."""
    if where == "gateway":
        return args.gateway_namespace, dict(args.gateway_selector), "GATEWAY"
    return args.client_namespace, {"app": args.client_app}, "SIDECAR_OUTBOUND"


def wasm_envoyfilter(args, config: dict, where: str) -> dict:
    """EnvoyFilter equivalent of a WasmPlugin, but with allow_on_headers_stop_iteration.

    Istio only honours EXTENSION_CONFIG patches with operation ADD (a MERGE onto the
    extension generated from a WasmPlugin is silently ignored), so the whole Wasm
    filter is declared here and referenced from the HTTP filter chain via ECDS.
    """
    namespace, selector, context = workload(args, where)
    ext_name = f"{namespace}.warmroute"
    listener_match = {"filterChain": {"filter": {"name": HCM, "subFilter": {"name": "envoy.filters.http.router"}}}}
    if where == "sidecar":
        listener_match["portNumber"] = args.port
    return {
        "apiVersion": "networking.istio.io/v1alpha3",
        "kind": "EnvoyFilter",
        "metadata": {"name": "warmroute", "namespace": namespace, "labels": labels(args)},
        "spec": {
            "workloadSelector": {"labels": selector},
            "configPatches": [
                {
                    "applyTo": "EXTENSION_CONFIG",
                    "match": {"context": context},
                    "patch": {
                        "operation": "ADD",
                        "value": {
                            "name": ext_name,
                            "typed_config": {
                                "@type": WASM_TYPE,
                                "config": {
                                    "name": "warmroute",
                                    "root_id": "",
                                    # The reason this file exists (Envoy >= 1.35): let the filter
                                    # pause on headers and still receive the body.
                                    "allow_on_headers_stop_iteration": True,
                                    # fail_open is what istio-agent reads (a failed OCI pull does
                                    # not NACK the listener); failure_policy is Envoy's newer field.
                                    "fail_open": True,
                                    "failure_policy": "FAIL_OPEN",
                                    "vm_config": {
                                        "vm_id": "warmroute",
                                        "runtime": "envoy.wasm.runtime.v8",
                                        "code": {
                                            "remote": {
                                                # istio-agent pulls oci:// and rewrites this to a local file
                                                # before Envoy sees it. It compares the image's manifest
                                                # digest with sha256 (not the .wasm's own hash), and the
                                                # uri pulls by that digest: a moved tag can never swap
                                                # the router's code.
                                                "http_uri": {"uri": module_uri(args), "cluster": "_", "timeout": "30s"},
                                                "sha256": args.digest,
                                            }
                                        },
                                    },
                                    "configuration": {
                                        "@type": "type.googleapis.com/google.protobuf.StringValue",
                                        "value": json.dumps(config, indent=2, sort_keys=False) + "\n",
                                    },
                                },
                            },
                        },
                    },
                },
                {
                    "applyTo": "HTTP_FILTER",
                    "match": {"context": context, "listener": listener_match},
                    "patch": {
                        # Immediately before the router: after Istio authn/authz and stats,
                        # same position as a WasmPlugin with UNSPECIFIED_PHASE.
                        "operation": "INSERT_BEFORE",
                        "value": {
                            "name": ext_name,
                            "config_discovery": {
                                "config_source": {"ads": {}, "initial_fetch_timeout": "0s", "resource_api_version": "V3"},
                                # Until the Wasm config arrives (or when it is rejected), an
                                # allow-all RBAC stands in, without warming: traffic flows,
                                # cache-blind, instead of Envoy answering 500 for want of a config.
                                "default_config": {"@type": RBAC_TYPE},
                                "apply_default_config_without_warming": True,
                                "type_urls": [WASM_TYPE, RBAC_TYPE],
                            },
                        },
                    },
                },
            ],
        },
    }


def override_host_policy(fallback: dict) -> dict:
    """Envoy's override_host load balancing: the endpoint named in x-gateway-destination-endpoint."""
    return {
        "policies": [
            {
                "typed_extension_config": {
                    "name": f"{LB}.override_host",
                    "typed_config": {
                        "@type": f"{LB_TYPE}.override_host.v3.OverrideHost",
                        "override_host_sources": [{"header": ENDPOINT_HEADER}],
                        "fallback_policy": {"policies": [{"typed_extension_config": fallback}]},
                    },
                }
            }
        ]
    }


ROUND_ROBIN = {"name": f"{LB}.round_robin", "typed_config": {"@type": f"{LB_TYPE}.round_robin.v3.RoundRobin"}}
# istio-agent's SDS, as Istio's bootstrap names it: the cluster `sds-grpc` (a Unix socket,
# ./var/run/secrets/workload-spiffe-uds/socket) serves the workload's certificate as `default`
# and the mesh's root CA as `ROOTCA` (pilot/pkg/security/model/authentication.go).
SDS_CLUSTER = "sds-grpc"
SDS_CERT = "default"
SDS_ROOT = "ROOTCA"
TLS_TYPE = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext"
RAW_BUFFER_TYPE = "type.googleapis.com/envoy.extensions.transport_sockets.raw_buffer.v3.RawBuffer"


def sds_secret(name: str) -> dict:
    """An SDS secret from istio-agent, as Istio's own clusters ask for it (ConstructSdsSecretConfig)."""
    return {
        "name": name,
        "sds_config": {
            "api_config_source": {
                "api_type": "GRPC",
                "set_node_on_first_message_only": True,
                "transport_api_version": "V3",
                "grpc_services": [{"envoy_grpc": {"cluster_name": SDS_CLUSTER}}],
            },
            "initial_fetch_timeout": "0s",
            "resource_api_version": "V3",
        },
    }


def istio_mtls_matches(args) -> list[dict]:
    """The scrape cluster's transport sockets, as Istio's outbound cluster for the Service has them
    under auto mTLS (pilot/pkg/networking/core/cluster_tls.go): Istio mTLS to an endpoint istiod
    marks `tlsMode: istio` (a pod with a sidecar), plain text to any other. The proxy's own
    certificate and the mesh's root CA come from istio-agent over SDS, so a pod under
    PeerAuthentication STRICT answers the scrape, and one under PERMISSIVE still does. Like
    Istio's, the peer's certificate is checked against the root CA, not against a service
    account (the gateway's connections to the pods carry the same trust)."""
    return [
        {
            "name": "tlsMode-istio",
            "match": {"tlsMode": "istio"},
            "transport_socket": {
                "name": "envoy.transport_sockets.tls",
                "typed_config": {
                    "@type": TLS_TYPE,
                    "common_tls_context": {
                        "tls_params": {"tls_minimum_protocol_version": "TLSv1_2",
                                       "tls_maximum_protocol_version": "TLSv1_3"},
                        # What Istio's HTTP/1.1 in-mesh clusters offer (util.ALPNInMeshWithMxc):
                        # the pod's inbound listener picks its mTLS filter chain by it.
                        "alpn_protocols": ["istio-peer-exchange", "istio"],
                        "tls_certificate_sds_secret_configs": [sds_secret(SDS_CERT)],
                        "combined_validation_context": {
                            "default_validation_context": {},
                            "validation_context_sds_secret_config": sds_secret(SDS_ROOT),
                        },
                    },
                    # Istio's SNI for the Service's outbound cluster (outbound_.<port>_.<subset>_.<host>).
                    "sni": f"outbound_.{args.port}_._.{fqdn(args.service, args.namespace)}",
                },
            },
        },
        {
            "name": "tlsMode-disabled",
            "match": {},
            "transport_socket": {"name": "envoy.transport_sockets.raw_buffer",
                                 "typed_config": {"@type": RAW_BUFFER_TYPE}},
        },
    ]


# Picks no host: the policy requires a fallback, no endpoint carries the selector's key, and
# NO_FALLBACK then gives up. This is envoy.yaml's pool-metrics policy.
NO_HOST = {
    "name": f"{LB}.subset",
    "typed_config": {
        "@type": f"{LB_TYPE}.subset.v3.Subset",
        "fallback_policy": "NO_FALLBACK",
        "subset_selectors": [{"keys": ["warmroute.no-subset"]}],
        "subset_lb_policy": {"policies": [{"typed_extension_config": ROUND_ROBIN}]},
    },
}


def stripped_headers(config: dict, where: str) -> list[str]:
    """The request headers Envoy drops from clients before any filter runs (early header
    mutation): every header only warmroute writes, and at the gateway also every header only a
    trusted stage before it may set (the gate's class and deadline, which RequestAuthentication's
    outputClaimToHeaders can write from a verified token: its jwt_authn filter runs after the
    strip). Not the gate's headers in the client sidecar: no RequestAuthentication runs on an
    outbound listener (pilot/pkg/networking/plugin/authn/authentication.go, BuildHTTP), and the
    gate there orders only the one app's own requests, so the app is the stage that sets them."""
    names = [ENDPOINT_HEADER, HEADER, MODEL_HEADER, config.get("route", {}).get("model_header")]
    if where == "gateway":
        gate = config.get("gate", {})
        names += [gate.get("header", GATE_HEADERS["header"]), OBJECTIVE_HEADER,
                  gate.get("deadline_header", GATE_HEADERS["deadline_header"])]
    out: list[str] = []
    for n in names:
        if n and n.lower() not in out:
            out.append(n.lower())
    return out


def routing_envoyfilter(args, config: dict, where: str) -> dict:
    """What the proxy that runs warmroute needs beside the filter, whichever form installs it.

    Apart from the Wasm EnvoyFilter, so a WasmPlugin can be used with it instead.
    """
    namespace, selector, context = workload(args, where)
    if where == "gateway":
        # The route configuration of the Gateway's listener port, its one virtual host. Not
        # {gateway: <ns>/<name>}: Istio names a plain-HTTP server's routes http.<port>, without
        # the gateway, and such a match never applies there (envoyfilter/rc_patch.go,
        # model.ParseGatewayRDSRouteName); it only selects HTTPS servers' routes.
        routes = {"portNumber": GATEWAY_PORT, "vhost": {"name": f"{args.external_host}:{GATEWAY_PORT}"}}
    else:
        routes = {"portNumber": args.port, "vhost": {"name": f"{fqdn(args.service, args.namespace)}:{args.port}"}}
    patches = [
        {
            # The body buffer the filter needs (see REQUEST_BODY_BUFFER_LIMIT). Envoy applies
            # a virtual host's limit from the moment the route matches, before any filter
            # buffers (Envoy >= 1.37).
            "applyTo": "VIRTUAL_HOST",
            "match": {"context": context, "routeConfiguration": routes},
            "patch": {"operation": "MERGE", "value": {"request_body_buffer_limit": REQUEST_BODY_BUFFER_LIMIT}},
        },
        {
            # The scrape cluster: the vLLM Service's endpoints, and a scrape reaches the pod
            # x-gateway-destination-endpoint names or fails. Istio's own cluster would fall back
            # to round robin (the override_host CLUSTER MERGE in envoyfilter-routing-*.yaml), and another pod's /metrics would
            # answer for an address that is no longer an endpoint. The endpoints come from istiod:
            # it answers an EDS request for any outbound|<port>|<subset>|<host> name by parsing
            # it (pilot/pkg/xds/eds.go, endpoints/endpoint_builder.go), whichever cluster asks.
            # Read from Istio's source; not tried in a live cluster here. mTLS per endpoint as
            # Istio's own cluster (istio_mtls_matches): the proxy's certificate to pods with a
            # sidecar, so scrapes pass PeerAuthentication STRICT; plain text to pods without.
            "applyTo": "CLUSTER",
            "match": {"context": context},
            "patch": {
                "operation": "ADD",
                "value": {
                    "name": METRICS_CLUSTER,
                    "type": "EDS",
                    "connect_timeout": "1s",
                    "eds_cluster_config": {
                        "service_name": cluster_name(args.service, args.namespace, args.port),
                        "eds_config": {"ads": {}, "resource_api_version": "V3"},
                    },
                    "load_balancing_policy": override_host_policy(NO_HOST),
                    "transport_socket_matches": istio_mtls_matches(args),
                },
            },
        },
    ]
    if args.route_mode == "endpoint":
        patches.append(
            {
                # The proxy's own admin, for the filter's read of the pool's endpoints
                # (GET /clusters?format=json&filter=^<pool.cluster>$ at the lease holder's tick).
                # No route may name this cluster (deploy/istio/check-warmroute.mjs refuses one
                # that does): the admin answers every path to whoever reaches it, POSTs
                # included, and POST /quitquitquit stops the proxy. Only the filter's
                # configuration names it. In a sidecar the app already shares the admin's
                # loopback; at the gateway, clients reach only what routes name.
                "applyTo": "CLUSTER",
                "match": {"context": context},
                "patch": {
                    "operation": "ADD",
                    "value": {
                        "name": ADMIN_CLUSTER,
                        "type": "STATIC",
                        "connect_timeout": "0.25s",
                        "load_assignment": {
                            "cluster_name": ADMIN_CLUSTER,
                            "endpoints": [{"lb_endpoints": [{"endpoint": {"address": {"socket_address": {
                                "address": PROXY_ADMIN[0], "port_value": PROXY_ADMIN[1]}}}}]}],
                        },
                    },
                },
            }
        )
    if where == "gateway" and args.peer_port:
        patches += [
            {
                # The peer port, on the gateway's one HTTP listener (PEER_BIND says why there):
                # the listener Istio binds for the Gateway's server, at its Service's targetPort
                # for port 80 (model/gateway.go resolvePorts), matched by that port alone so no
                # other listener gets the same address (a second bind would fail the update).
                "applyTo": "LISTENER",
                "match": {"context": context, "listener": {"portNumber": args.gateway_target_port}},
                "patch": {"operation": "MERGE", "value": {"additional_addresses": [peer_address(args.peer_port)]}},
            },
            {
                # The replicas' peer ports (peers.cluster): the headless Service's endpoints from
                # istiod, and a pull reaches the replica x-gateway-destination-endpoint names or
                # fails (as a scrape its pod). Plain text: the peer port is the gateway's own
                # listener, which terminates no mesh mTLS. Read from Istio's source; not tried in
                # a live cluster here.
                "applyTo": "CLUSTER",
                "match": {"context": context},
                "patch": {
                    "operation": "ADD",
                    "value": {
                        "name": PEERS_CLUSTER,
                        "type": "EDS",
                        "connect_timeout": "1s",
                        "eds_cluster_config": {
                            "service_name": cluster_name(PEERS_SERVICE, namespace, args.peer_port),
                            "eds_config": {"ads": {}, "resource_api_version": "V3"},
                        },
                        "load_balancing_policy": override_host_policy(NO_HOST),
                    },
                },
            },
        ]
    # Every listener of the gateway; in the sidecar, the outbound listener of the vLLM port.
    hcm_listener = {"filterChain": {"filter": {"name": HCM}}}
    if where == "sidecar":
        hcm_listener = {"portNumber": args.port, **hcm_listener}
    patches += [
        {
            # The filter's x-gateway-destination-endpoint picks the pod; with no header (the
            # filter failed open, or an address no longer an endpoint) round robin still
            # routes. The cluster the filter's pool follows: its endpoints are what istiod
            # gives this very cluster. In header mode the subset clusters get the policy too,
            # harmless with one endpoint each. Envoy ignores the DestinationRule's lb_policy
            # where load_balancing_policy is set. Istio's defaults already allow any number
            # of outstanding retries and connections per cluster (Envoy's own, 3 retries and
            # 1024 connections, fail a pod that dies under load: see ../envoy.yaml); a
            # DestinationRule connectionPool.http.maxRetries or tcp.maxConnections brings
            # those limits back. Needs envoy.load_balancing_policies.override_host in the
            # proxy's Envoy (the 1.40 line this project targets has it).
            "applyTo": "CLUSTER",
            "match": {"context": context, "cluster": {"service": fqdn(args.service, args.namespace),
                                                      "portNumber": args.port}},
            "patch": {"operation": "MERGE", "value": {"load_balancing_policy": override_host_policy(ROUND_ROBIN)}},
        },
        {
            # The client never picks its pod, even while the filter is not running (every
            # shipped config fails open): Envoy drops the routing headers itself, before it
            # selects a route and before any HTTP filter runs (early header mutation). The
            # filter writes its own afterwards. At the gateway the gate's class and deadline go
            # too: only a stage before warmroute sets them (stripped_headers).
            "applyTo": "NETWORK_FILTER",
            "match": {"context": context, "listener": hcm_listener},
            "patch": {
                "operation": "MERGE",
                "value": {
                    "typed_config": {
                        "@type": HCM_TYPE,
                        "early_header_mutation_extensions": [
                            {
                                "name": "envoy.http.early_header_mutation.header_mutation",
                                "typed_config": {
                                    "@type": "type.googleapis.com/envoy.extensions.http.early_header_mutation"
                                             ".header_mutation.v3.HeaderMutation",
                                    "mutations": [{"remove": h} for h in stripped_headers(config, where)],
                                },
                            }
                        ],
                    }
                },
            },
        },
    ]
    return {
        "apiVersion": "networking.istio.io/v1alpha3",
        "kind": "EnvoyFilter",
        "metadata": {"name": "warmroute-routing", "namespace": namespace, "labels": labels(args)},
        "spec": {"workloadSelector": {"labels": selector}, "configPatches": patches},
    }


BANNER_START = "# GENERATED by istio/generate.py"
BANNER = BANNER_START + " -- do not edit; re-run:\n#   python3 istio/generate.py {argv}\n"
OUTPUTS = ("gateway.yaml", "destinationrule.yaml", "virtualservice.yaml", "httproute.yaml", "virtualservice-mesh.yaml", "pluginconfig.json",
           "envoyfilter-wasm-gateway.yaml", "envoyfilter-wasm-sidecar.yaml",
           "envoyfilter-routing-gateway.yaml", "envoyfilter-routing-sidecar.yaml",
           "stats-tags-gateway.yaml", "stats-tags-sidecar.yaml", "peers.yaml", "networkpolicy-peers.yaml")
ADMIN_NOTE = (
    "# warmroute-envoy-admin is this proxy's own admin interface (127.0.0.1:15000), which the\n"
    "# filter reads the pool's endpoints through. No route may name it: the admin answers every\n"
    "# path to whoever reaches it, POSTs included (POST /quitquitquit stops the proxy).\n"
)


PEERS_NOTE = (
    "# The gateway's replicas on their peer port, for the exchange between them: the endpoints of the\n"
    "# warmroute-peers cluster (envoyfilter-routing-gateway.yaml). No Service in front of clients\n"
    "# carries this port.\n"
)
NETPOL_NOTE = (
    "# Optional, where the CNI enforces NetworkPolicy: the peer port from the gateway's own pods only,\n"
    "# every other port open as before. Policies add up: if another NetworkPolicy already selects the\n"
    "# gateway's pods, add the second ingress rule to it instead of applying this one.\n"
)


def module_uri(args) -> str:
    """oci://<repository>[:<tag>]@sha256:<manifest digest>: pulled by digest, the tag kept for people."""
    return f"{args.image}@sha256:{args.digest}"


# Keys of the pluginConfig wired to the Istio objects this script writes: --config may not
# change them (the flags that set them say so).
WIRED = {
    ("pool",): "set by --service, --namespace, --port, --max-backends, --models, --adapters",
    ("backends",): "set by --route-mode header, --replicas, --pod-ips",
    ("route", "mode"): "set by --route-mode",
    ("route", "header"): "set by --route-mode",
    ("metrics", "cluster"): "the cluster the routing EnvoyFilters add",
    ("peers", "cluster"): "the cluster the gateway's routing EnvoyFilter adds with --peer-port",
    ("peers", "port"): "set by --peer-port",
    ("peers", "admin_cluster"): "the admin cluster the routing EnvoyFilters add",
}


def merge(base: dict, over: dict, path: tuple = ()) -> dict:
    """over merged into a copy of base: objects key by key, anything else replaces."""
    out = copy.deepcopy(base)
    for k, v in over.items():
        here = path + (k,)
        if isinstance(v, dict) and isinstance(out.get(k), dict) and here not in WIRED:
            out[k] = merge(out[k], v, here)
        else:
            out[k] = copy.deepcopy(v)
    return out


def wired_overrides(over: dict, path: tuple = ()) -> list[str]:
    found = []
    for k, v in over.items():
        here = path + (k,)
        if here in WIRED:
            found.append(f"{'.'.join(here)} ({WIRED[here]})")
        elif isinstance(v, dict):
            found += wired_overrides(v, here)
    return found


def config_checker(root: str) -> list[str]:
    """The command that runs warmroute-check-config: the filter's own Config::parse."""
    if os.environ.get("WARMROUTE_CHECK_CONFIG"):
        return [os.environ["WARMROUTE_CHECK_CONFIG"]]
    built = os.path.join(root, "target", "release", "warmroute-check-config")
    if os.access(built, os.X_OK):
        return [built]
    return ["cargo", "run", "-q", "--release", "--manifest-path", os.path.join(root, "Cargo.toml"),
            "-p", "warmroute-core", "--bin", "warmroute-check-config", "--"]


def check_config(p, config: dict, source: str) -> None:
    """Refuse a merged config the filter would refuse, or that overflows the proxy's buffers."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "pluginconfig.json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump(config, f)
        # The buffers the routing EnvoyFilters give the filter: body, listener (Envoy's default).
        cmd = config_checker(root) + ["--buffer-limits", f"{REQUEST_BODY_BUFFER_LIMIT},{LISTENER_BUFFER_LIMIT}", path]
        try:
            r = subprocess.run(cmd, capture_output=True, text=True)
        except OSError as e:
            p.error(f"--config: cannot run warmroute-check-config ({' '.join(cmd[:3])}...): {e}")
    if r.returncode != 0:
        why = (r.stdout + r.stderr).strip().replace(path, f"{source} merged over the generated pluginConfig")
        p.error(f"--config: the filter refuses the result:\n{why}")


def selector(p, value: str) -> dict:
    """--gateway-selector key=value[,key=value...]: the labels the gateway pods carry."""
    out = {}
    for item in (v.strip() for v in value.split(",")):
        k, sep, v = item.partition("=")
        if not sep or not re.fullmatch(r"([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?", k) \
                or not re.fullmatch(r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?", v) or len(v) > 63:
            p.error(f"--gateway-selector: {item!r} is not a Kubernetes label key=value")
        out[k] = v
    return out


def names(p, flag: str, value: str) -> list[str]:
    out = [v.strip() for v in value.split(",") if v.strip()]
    if any(len(v) > 256 for v in out):
        p.error(f"{flag}: names must be 1-256 characters")
    return out


def read_overrides(p: argparse.ArgumentParser, path: str) -> dict:
    """The JSON object of `--config`, refused (naming the keys) where it sets what the
    generated objects wire themselves."""
    try:
        with open(path, encoding="utf-8") as f:
            over = json.load(f)
    except (OSError, ValueError) as e:
        p.error(f"--config: {e}")
    if not isinstance(over, dict):
        p.error("--config: the file must hold one JSON object")
    wired = wired_overrides(over)
    if wired:
        p.error(f"--config sets {', '.join(wired)}: these are wired to the generated objects")
    return over


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--namespace", required=True, help="namespace of the vLLM Service and its pods")
    p.add_argument("--service", default="vllm", help="routing (ClusterIP) Service name (== StatefulSet name in header mode)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--route-mode", choices=["endpoint", "header"], default="endpoint",
                   help="endpoint (default): follow the Service's pods, nothing per pod; "
                        "header: one subset and route per pod, re-run whenever pods change")
    p.add_argument("--max-backends", type=int, default=None,
                   help="endpoint mode: most pods routed over at once (pool.max_backends, default 64)")
    p.add_argument("--replicas", type=int, default=None, help="header mode: StatefulSet replicas (pods <service>-0..N-1)")
    p.add_argument("--pod-ips", default="", help="header mode: comma-separated pod IPs in ordinal order")
    p.add_argument("--headless-service", default=None, help="header mode: governing headless Service (default <service>-headless)")
    p.add_argument("--models", default="", help="comma-separated models every pod serves (default: none declared, any goes)")
    p.add_argument("--adapters", default="", help="comma-separated LoRA adapters every pod can load")
    p.add_argument("--gateway", default="istio-system/warmroute-gateway",
                   help="<ns>/<name> of the Gateway generated (gateway.yaml) and bound by the VirtualService")
    p.add_argument("--external-host", default="llm.example.com")
    p.add_argument("--gateway-namespace", default=None,
                   help="namespace of the gateway pods, where the gateway EnvoyFilters go (default: --gateway's)")
    p.add_argument("--gateway-selector", default=None,
                   help="key=value[,key=value]: labels of the gateway pods (default istio=ingressgateway; "
                        f"with --gateway-api {GATEWAY_NAME_LABEL}=<name>)")
    p.add_argument("--gateway-api", action="store_true",
                   help="a gateway.networking.k8s.io Gateway and HTTPRoute instead of Istio's Gateway and VirtualService")
    p.add_argument("--gateway-class", default="istio", help="--gateway-api: the Gateway's gatewayClassName")
    p.add_argument("--revision", default="",
                   help="Istio revision: every object gets istio.io/rev=<revision>, read by that istiod only")
    p.add_argument("--peer-port", type=int, default=None,
                   help="the exchange between the gateway's replicas: the port (e.g. 15099) each replica serves "
                        "its recent index events on, to the other replicas only (no Service in front of clients "
                        "has it); adds peers.yaml, networkpolicy-peers.yaml and the gateway's peers cluster")
    p.add_argument("--gateway-target-port", type=int, default=None,
                   help=f"with --peer-port, classic gateway: the port its pods listen on for the Gateway's server "
                        f"on {GATEWAY_PORT}, its Service's targetPort ({GATEWAY_PORT} with Istio's gateway Helm chart, "
                        "8080 for istioctl's istio-ingressgateway); the peer port is added to that listener")
    p.add_argument("--client-namespace", default="apps")
    p.add_argument("--client-app", default="chat-frontend")
    p.add_argument("--image", default="oci://ghcr.io/warmroute/warmroute:0.1.0",
                   help="oci://<registry>/<repository>[:<tag>] the image was pushed to")
    p.add_argument("--digest",
                   help="sha256:<hex> manifest digest of that image (deploy/oci/oci_artifact.py prints it; "
                        "not the .wasm's sha256)")
    p.add_argument("--sha256", help=argparse.SUPPRESS)
    p.add_argument("--config", help="JSON file merged over the generated pluginConfig, checked by the filter's parser")
    p.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "generated"))
    args = p.parse_args(argv)

    if not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", args.service):
        p.error("--service must be a DNS-1123 label")
    if args.sha256 is not None:
        p.error("--sha256 (the .wasm file's hash) is gone: istio-agent compares an oci:// module with the "
                "image's manifest digest, so that pin never matched. Pass --digest sha256:<manifest digest>, "
                "which deploy/oci/oci_artifact.py prints (make release)")
    m = re.fullmatch(r"(?:sha256:)?([0-9a-f]{64})", args.digest or "")
    if not m:
        p.error("--digest must be sha256:<64 lower-case hex digits>, the image's manifest digest")
    args.digest = m.group(1)
    # registry[:port]/repository[:tag], as a reference by tag (the digest is appended).
    if not re.fullmatch(r"oci://[A-Za-z0-9.-]+(:[0-9]+)?(/[a-z0-9]+([._-]+[a-z0-9]+)*)+(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?",
                        args.image):
        p.error("--image must be oci://<registry>/<repository>[:<tag>], without a digest (--digest gives it)")
    if not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?/[a-z0-9]([-a-z0-9]*[a-z0-9])?", args.gateway):
        p.error("--gateway must be <namespace>/<name>")
    gw_namespace, gw_name = args.gateway.split("/", 1)
    args.gateway_namespace = args.gateway_namespace or gw_namespace
    if args.gateway_api:
        # Istio deploys a Gateway API gateway's pods in the Gateway's namespace.
        if args.gateway_namespace != gw_namespace:
            p.error("--gateway-api: the gateway pods run in the Gateway's namespace; drop --gateway-namespace")
        if args.route_mode == "header":
            p.error("--gateway-api routes to the Service; the per-pod subsets of --route-mode header "
                    "have no HTTPRoute form")
    elif args.gateway_class != "istio":
        p.error("--gateway-class is for --gateway-api")
    args.gateway_selector = selector(p, args.gateway_selector or (
        f"{GATEWAY_NAME_LABEL}={gw_name}" if args.gateway_api else "istio=ingressgateway"))
    if args.revision and not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", args.revision):
        p.error("--revision must be an Istio revision name (a DNS-1123 label)")
    args.models = names(p, "--models", args.models)
    args.adapters = names(p, "--adapters", args.adapters)
    args.headless_service = args.headless_service or f"{args.service}-headless"
    args.pod_ips = [s.strip() for s in args.pod_ips.split(",") if s.strip()]
    if args.route_mode == "endpoint":
        # Refused rather than ignored: a command line written for header mode must not yield a
        # config that silently differs from what its author meant.
        for flag, given in (("--replicas", args.replicas is not None), ("--pod-ips", bool(args.pod_ips)),
                            ("--headless-service", args.headless_service != f"{args.service}-headless")):
            if given:
                p.error(f"{flag} is for --route-mode header; endpoint mode follows the Service's pods")
        args.max_backends = 64 if args.max_backends is None else args.max_backends
        if not 1 <= args.max_backends <= 1024:
            p.error("--max-backends must be in 1..=1024 (the filter's slot limit)")
    else:
        if args.max_backends is not None:
            p.error("--max-backends is for endpoint mode; header mode routes over exactly --replicas pods")
        if args.replicas is None or not 1 <= args.replicas <= 1024:
            p.error("--route-mode header needs --replicas in 1..=1024 (the filter's backend limit)")
        # A backend's address is where its scrapes go: without the pods' real IPs every scrape
        # fails and the filter routes blind.
        if len(args.pod_ips) != args.replicas:
            p.error(f"--route-mode header needs --pod-ips with one IP per replica ({len(args.pod_ips)} given, "
                    f"--replicas is {args.replicas})")
        for ip in args.pod_ips:
            try:
                ipaddress.ip_address(ip)
            except ValueError:
                p.error(f"--pod-ips: {ip!r} is not an IP address")

    if args.peer_port is None:
        if args.gateway_target_port is not None:
            p.error("--gateway-target-port is for --peer-port")
    else:
        if args.route_mode == "header":
            p.error("--peer-port: the exchange ships for the default endpoint mode (its pool's admin cluster)")
        if args.gateway_api and args.gateway_target_port is not None:
            p.error(f"--gateway-target-port: a Gateway API gateway's pods listen on the listener's own port "
                    f"({GATEWAY_PORT}): drop it")
        args.gateway_target_port = GATEWAY_PORT if args.gateway_target_port is None else args.gateway_target_port
        if not 1 <= args.gateway_target_port <= 65535:
            p.error("--gateway-target-port must be a port (1-65535)")
        if not 1024 <= args.peer_port <= 65535:
            p.error("--peer-port must be in 1024-65535 (an unprivileged port the gateway's pods can bind)")
        if args.peer_port in ISTIO_PORTS:
            p.error(f"--peer-port {args.peer_port} is one of the ports Istio's proxies use ({', '.join(map(str, ISTIO_PORTS))})")
        if args.peer_port in (GATEWAY_PORT, args.gateway_target_port):
            p.error(f"--peer-port {args.peer_port} is the gateway's client port: clients would read the peers' events")

    # Reproducible command line in the banner (without --out, which is a local path).
    shown = []
    skip = False
    for a in (argv if argv is not None else sys.argv[1:]):
        if skip:
            skip = False
            continue
        if a == "--out":
            skip = True
            continue
        if a.startswith("--out="):
            continue
        shown.append(a)
    banner = BANNER.format(argv=" ".join(shown))

    config = plugin_config(args)
    if args.config:
        config = merge(config, read_overrides(p, args.config))
        check_config(p, config, args.config)
    routing_note = ADMIN_NOTE if args.route_mode == "endpoint" else ""
    os.makedirs(args.out, exist_ok=True)
    files = {
        "gateway.yaml": banner + documents([gateway(args)]),
        "destinationrule.yaml": banner + documents([destination_rule(args)]),
        **({"httproute.yaml": banner + documents([http_route(args)])} if args.gateway_api
           else {"virtualservice.yaml": banner + documents([virtual_service(args)])}),
        "pluginconfig.json": json.dumps(config, indent=2) + "\n",
        "envoyfilter-wasm-gateway.yaml": banner + documents([wasm_envoyfilter(args, config, "gateway")]),
        "envoyfilter-wasm-sidecar.yaml": banner + documents([wasm_envoyfilter(args, config, "sidecar")]),
        "envoyfilter-routing-gateway.yaml": banner + routing_note + documents([routing_envoyfilter(args, config, "gateway")]),
        "envoyfilter-routing-sidecar.yaml": banner + routing_note + documents([routing_envoyfilter(args, config, "sidecar")]),
        "stats-tags-gateway.yaml": banner + stats_note(args, "gateway") + documents(stats_configmaps(args, "gateway")),
        "stats-tags-sidecar.yaml": banner + stats_note(args, "sidecar") + documents(stats_configmaps(args, "sidecar")),
    }
    if args.route_mode == "header":
        files["virtualservice-mesh.yaml"] = banner + documents([mesh_virtual_service(args)])
    if args.peer_port:
        # The exchange is between the gateway's replicas: the sidecar variant is not written (its
        # pluginConfig would name a peers cluster no sidecar has).
        for name in ("envoyfilter-wasm-sidecar.yaml", "envoyfilter-routing-sidecar.yaml", "stats-tags-sidecar.yaml"):
            del files[name]
        gw_ns, gw_selector, _ = workload(args, "gateway")
        files["peers.yaml"] = banner + PEERS_NOTE + documents([peers_service(
            PEERS_SERVICE, gw_ns, gw_selector, args.peer_port, labels(args),
            # Seen by the proxies of the gateway's namespace only: no sidecar elsewhere gets the
            # gateway's pods as endpoints of it (serviceregistry/kube/conversion.go).
            {"networking.istio.io/exportTo": "."})])
        files["networkpolicy-peers.yaml"] = banner + NETPOL_NOTE + documents([peers_network_policy(
            PEERS_SERVICE, gw_ns, gw_selector, args.peer_port, labels(args))])
    for name, text in files.items():
        with open(os.path.join(args.out, name), "w", encoding="utf-8", newline="\n") as f:
            f.write(text)
    # A header-mode run left in the directory would still be applied with `kubectl apply -f`.
    for name in sorted(set(OUTPUTS) - set(files)):
        stale = os.path.join(args.out, name)
        if os.path.exists(stale):
            with open(stale, encoding="utf-8") as f:
                ours = f.read(len(BANNER_START)) == BANNER_START
            if ours:
                os.remove(stale)
                print(f"generate.py: removed {name}, which this mode does not use", file=sys.stderr)
    print(f"generate.py: wrote {', '.join(sorted(files))} to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
