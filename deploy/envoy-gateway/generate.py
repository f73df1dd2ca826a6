#!/usr/bin/env python3
"""Generate warmroute's Envoy Gateway objects for a vLLM Service.

A gateway.networking.k8s.io GatewayClass (--gateway-class, Envoy Gateway's controller), Gateway and HTTPRoute to
the Service, and one EnvoyPatchPolicy that adds to the xDS Envoy Gateway generates for them what
the filter needs, as JSON patches on named resources:

  Listener <gw-ns>/<gw>/http            the Wasm HTTP filter (first in the chain), with
                                        allow_on_headers_stop_iteration: true; the strip of
                                        clients' routing headers (early header mutation)
  RouteConfiguration <gw-ns>/<gw>/http  the body buffer (request_body_buffer_limit) on its
                                        virtual host
  Cluster httproute/<ns>/<svc>/rule/0   the override_host load-balancing policy (the pool the
                                        filter follows: pool.cluster)
  Cluster warmroute-metrics (new)       the strict scrape cluster metrics.cluster names: the same
                                        endpoints (EDS), no fallback host
  Cluster warmroute-envoy-admin (new)   the proxy's own admin (127.0.0.1:19000 in Envoy
                                        Gateway's bootstrap), read for the pool's endpoints
  Cluster warmroute-wasm-source (new)   the host of --wasm-url, where Envoy fetches the module

With --peer-port, the exchange between the gateway's replicas (docs/deploy/envoy-gateway.md,
Several gateway replicas), and two more objects in the namespace Envoy Gateway runs the gateway's
proxies in (--proxy-namespace):

  Listener <gw-ns>/<gw>/http            the peer port as an additional address of the listener
                                        (one listener, one filter: the plugin that routes
                                        answers the peers; Envoy Gateway's Service carries the
                                        Gateway's listener ports only)
  Cluster warmroute-peers (new)         STRICT_DNS of the headless Service below: the replicas'
                                        peer ports, a pull reaching the one named or failing
  peers.yaml                            a headless Service selecting the gateway's proxy pods on
                                        the peer port (Envoy Gateway serves EDS for the clusters
                                        it generates only: DNS brings the replicas here)
  networkpolicy-peers.yaml              the peer port from those pods only, every other port as
                                        before (optional: where the CNI enforces it)

The filter's stats as Prometheus labels: an EnvoyProxy (envoyproxy.yaml) whose spec.bootstrap
(type Merge) adds istio/generate.py's stats_config.stats_tags to Envoy Gateway's own bootstrap
(internal/xds/bootstrap/util.go mergeBootstrap: proto.Merge, the tags appended), attached to the
Gateway by its infrastructure.parametersRef (Envoy Gateway >= 1.1).

Why a patch and not an EnvoyExtensionPolicy: its Wasm API (api/v1alpha1/wasm_types.go) has no
allow_on_headers_stop_iteration, and Envoy Gateway's translator never sets it
(https://github.com/envoyproxy/gateway/issues/8382). Without it the filter never gets the body.

Names are Envoy Gateway's default xDS name scheme (runtime flag XDSNameSchemeV2 off): listener
and route configuration <gateway namespace>/<gateway name>/<listener name>
(internal/xds/translator/listener.go), an HTTPRoute rule's cluster
httproute/<namespace>/<name>/rule/<index> (internal/gatewayapi/helpers.go), with no
EnvoyProxy mergeGateways or mergeBackends. A plain-HTTP listener's connection manager is
the first filter of its default_filter_chain.

The module: a raw Envoy config cannot name an oci:// image (Envoy Gateway pulls those only for
EnvoyExtensionPolicy, through its own cache), so Envoy fetches the .wasm itself from --wasm-url
(code.remote, through the warmroute-wasm-source cluster) and refuses any file whose sha256 is
not --wasm-sha256 (sha256sum dist/warmroute.wasm): a replaced file can never swap the code.

The filter configuration is istio/generate.py's (same defaults, same --config merge and
check), with pool.cluster the HTTPRoute rule's cluster and Envoy Gateway's admin port.

  python3 deploy/envoy-gateway/generate.py --namespace llm --service vllm \\
      --wasm-url https://models.example.com/warmroute/0.1.0/warmroute.wasm \\
      --wasm-sha256 "$(sha256sum dist/warmroute.wasm | cut -d' ' -f1)"
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import sys
import urllib.parse

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def _istio_generate():
    """istio/generate.py as a module: its filter configuration, YAML emitter and LB policies."""
    spec = importlib.util.spec_from_file_location("warmroute_istio_generate", os.path.join(ROOT, "istio", "generate.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


ig = _istio_generate()

LISTENER_TYPE = "type.googleapis.com/envoy.config.listener.v3.Listener"
ROUTE_TYPE = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration"
CLUSTER_TYPE = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
# Where Envoy Gateway's bootstrap puts the proxy's admin (internal/xds/bootstrap EnvoyAdminPort).
EG_ADMIN = ("127.0.0.1", 19000)
WASM_SOURCE_CLUSTER = "warmroute-wasm-source"
# The EnvoyProxy the Gateway names in infrastructure.parametersRef (envoyproxy.yaml).
ENVOY_PROXY = "warmroute"
# The labels Envoy Gateway puts on a Gateway's proxy pods (internal/infrastructure/kubernetes/proxy/
# resource.go EnvoyAppLabel; internal/gatewayapi/helpers.go GatewayOwnerLabels), which its own
# Deployment selects them by (resource_provider.go stableSelector).
PROXY_LABELS = {"app.kubernetes.io/name": "envoy", "app.kubernetes.io/component": "proxy",
                "app.kubernetes.io/managed-by": "envoy-gateway"}
OWNER_NAME_LABEL = "gateway.envoyproxy.io/owning-gateway-name"
OWNER_NAMESPACE_LABEL = "gateway.envoyproxy.io/owning-gateway-namespace"
# Where Envoy Gateway runs the proxies: its controller's namespace (the Helm chart's), or the
# Gateway's own with its provider's gatewayNamespaceMode.
PROXY_NAMESPACE = "envoy-gateway-system"
# Ports Envoy Gateway's proxies use (internal/xds/bootstrap/bootstrap.go: admin, stats, readiness).
EG_PORTS = (19000, 19001, 19003)
LISTENER_NAME = "http"
HCM = "/default_filter_chain/filters/0/typed_config"
TLS_TYPE = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext"

BANNER_START = "# GENERATED by deploy/envoy-gateway/generate.py"
BANNER = BANNER_START + " -- do not edit; re-run:\n#   python3 deploy/envoy-gateway/generate.py {argv}\n"


def proxy_selector(args) -> dict:
    gw_ns, gw_name = args.gateway.split("/", 1)
    return {**PROXY_LABELS, OWNER_NAME_LABEL: gw_name, OWNER_NAMESPACE_LABEL: gw_ns}


def peers_service_name(args) -> str:
    # One per Gateway: the proxies' namespace holds every Gateway's proxies.
    return f"warmroute-peers-{args.gateway.split('/', 1)[1]}"


def peers_cluster(args) -> dict:
    """The replicas' peer ports: every ready proxy pod of the Gateway, as the headless Service's DNS
    name resolves (one A record per pod), re-resolved every 5 s; a pull reaches the replica
    x-gateway-destination-endpoint names or fails. Plain text: the peer port is the gateway's own
    listener."""
    host = f"{peers_service_name(args)}.{args.proxy_namespace}.svc.cluster.local"
    return {
        "name": ig.PEERS_CLUSTER,
        "type": "STRICT_DNS",
        "connect_timeout": "1s",
        "dns_lookup_family": "V4_ONLY",
        "dns_refresh_rate": "5s",
        "load_assignment": {"cluster_name": ig.PEERS_CLUSTER, "endpoints": [{"lb_endpoints": [{"endpoint": {
            "address": {"socket_address": {"address": host, "port_value": args.peer_port}}}}]}]},
        "load_balancing_policy": ig.override_host_policy(ig.NO_HOST),
    }


def pool_cluster(args) -> str:
    """Envoy Gateway's cluster for the HTTPRoute's rule 0 (irRouteDestinationName)."""
    return f"httproute/{args.namespace}/{args.service}/rule/0"


def xds_listener(args) -> str:
    gw_ns, gw_name = args.gateway.split("/", 1)
    return f"{gw_ns}/{gw_name}/{LISTENER_NAME}"


def labels() -> dict:
    return {"app.kubernetes.io/part-of": "warmroute", "app.kubernetes.io/managed-by": "warmroute-generate"}


def gateway_class(args) -> dict:
    """Envoy Gateway's GatewayClass (its Helm chart installs none; its quickstart's is this)."""
    return {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "GatewayClass",
        "metadata": {"name": args.gateway_class, "labels": labels()},
        "spec": {"controllerName": "gateway.envoyproxy.io/gatewayclass-controller"},
    }


def gateway(args) -> dict:
    gw_ns, gw_name = args.gateway.split("/", 1)
    return {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "Gateway",
        "metadata": {"name": gw_name, "namespace": gw_ns, "labels": labels()},
        "spec": {
            "gatewayClassName": args.gateway_class,
            "listeners": [{
                "name": LISTENER_NAME,
                "hostname": args.external_host,
                "port": ig.GATEWAY_PORT,
                "protocol": "HTTP",
                "allowedRoutes": {"namespaces": {"from": "Selector", "selector": {
                    "matchLabels": {"kubernetes.io/metadata.name": args.namespace}}}},
            }],
            # Its proxies' bootstrap: the stats tags (envoyproxy.yaml).
            "infrastructure": {"parametersRef": {"group": "gateway.envoyproxy.io", "kind": "EnvoyProxy", "name": ENVOY_PROXY}},
        },
    }


def envoy_proxy(args) -> dict:
    gw_ns, _ = args.gateway.split("/", 1)
    return {
        "apiVersion": "gateway.envoyproxy.io/v1alpha1",
        "kind": "EnvoyProxy",
        "metadata": {"name": ENVOY_PROXY, "namespace": gw_ns, "labels": labels()},
        "spec": {"bootstrap": {"type": "Merge", "value": ig.to_yaml({"stats_config": {"stats_tags": ig.STATS_TAGS}})}},
    }


def http_route(args) -> dict:
    gw_ns, gw_name = args.gateway.split("/", 1)
    return {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "HTTPRoute",
        "metadata": {"name": args.service, "namespace": args.namespace, "labels": labels()},
        "spec": {
            "parentRefs": [{"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": gw_name,
                            "namespace": gw_ns, "sectionName": LISTENER_NAME}],
            "hostnames": [args.external_host],
            # One rule, one backend: its cluster is httproute/<ns>/<svc>/rule/0.
            "rules": [{"backendRefs": [{"name": args.service, "port": args.port}], "timeouts": {"request": "0s"}}],
        },
    }


def wasm_source_cluster(args) -> dict:
    u = urllib.parse.urlsplit(args.wasm_url)
    tls = u.scheme == "https"
    port = u.port or (443 if tls else 80)
    cluster = {
        "name": WASM_SOURCE_CLUSTER,
        "type": "STRICT_DNS",
        "connect_timeout": "5s",
        "dns_lookup_family": "V4_PREFERRED",
        "load_assignment": {"cluster_name": WASM_SOURCE_CLUSTER, "endpoints": [{"lb_endpoints": [{"endpoint": {
            "address": {"socket_address": {"address": u.hostname, "port_value": port}}}}]}]},
    }
    if tls:
        # The module's integrity is its sha256; TLS here only carries it.
        cluster["transport_socket"] = {"name": "envoy.transport_sockets.tls",
                                       "typed_config": {"@type": TLS_TYPE, "sni": u.hostname}}
    return cluster


def wasm_filter(args, config: dict) -> dict:
    return {
        "name": "envoy.filters.http.wasm.warmroute",
        "typed_config": {
            "@type": ig.WASM_TYPE,
            "config": {
                "name": "warmroute",
                "root_id": "",
                # What EnvoyExtensionPolicy cannot set (envoyproxy/gateway#8382): let the filter
                # pause on the headers and still receive the body.
                "allow_on_headers_stop_iteration": True,
                "failure_policy": "FAIL_OPEN",
                "vm_config": {
                    "vm_id": "warmroute",
                    "runtime": "envoy.wasm.runtime.v8",
                    "code": {"remote": {
                        "http_uri": {"uri": args.wasm_url, "cluster": WASM_SOURCE_CLUSTER, "timeout": "30s"},
                        "sha256": args.wasm_sha256,
                        "retry_policy": {"num_retries": 5},
                    }},
                },
                "configuration": {
                    "@type": "type.googleapis.com/google.protobuf.StringValue",
                    "value": json.dumps(config, indent=2) + "\n",
                },
            },
        },
    }


def patch_policy(args, config: dict) -> dict:
    gw_ns, gw_name = args.gateway.split("/", 1)
    listener = xds_listener(args)

    def add(type_url: str, name: str, path: str, value) -> dict:
        return {"type": type_url, "name": name, "operation": {"op": "add", "path": path, "value": value}}

    patches = [
        # First in the connection manager's chain (the router stays last).
        add(LISTENER_TYPE, listener, f"{HCM}/http_filters/0", wasm_filter(args, config)),
        # Clients never pick their pod nor their priority: Envoy drops the routing headers and
        # the gate's class and deadline before it selects a route and before any HTTP filter
        # runs, so also while the filter is not running (istio/generate.py, stripped_headers).
        add(LISTENER_TYPE, listener, f"{HCM}/early_header_mutation_extensions", [{
            "name": "envoy.http.early_header_mutation.header_mutation",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.http.early_header_mutation.header_mutation.v3.HeaderMutation",
                "mutations": [{"remove": h} for h in ig.stripped_headers(config, "gateway")],
            },
        }]),
        # What one request may buffer while the filter reads it (istio/generate.py says why).
        add(ROUTE_TYPE, listener, "/virtual_hosts/0/request_body_buffer_limit", ig.REQUEST_BODY_BUFFER_LIMIT),
        # The pod the filter names in x-gateway-destination-endpoint; round robin without it.
        # Replaces Envoy Gateway's least_request policy on this cluster only.
        add(CLUSTER_TYPE, pool_cluster(args), "/load_balancing_policy", ig.override_host_policy(ig.ROUND_ROBIN)),
        # Scrapes reach exactly their pod or fail: the pool's endpoints, no fallback host.
        add(CLUSTER_TYPE, ig.METRICS_CLUSTER, "", {
            "name": ig.METRICS_CLUSTER,
            "type": "EDS",
            "connect_timeout": "1s",
            "eds_cluster_config": {"service_name": pool_cluster(args),
                                   "eds_config": {"ads": {}, "resource_api_version": "V3"}},
            "load_balancing_policy": ig.override_host_policy(ig.NO_HOST),
        }),
        # The proxy's admin, read by the filter for the pool's endpoints. No route may name it.
        add(CLUSTER_TYPE, ig.ADMIN_CLUSTER, "", {
            "name": ig.ADMIN_CLUSTER,
            "type": "STATIC",
            "connect_timeout": "0.25s",
            "load_assignment": {"cluster_name": ig.ADMIN_CLUSTER, "endpoints": [{"lb_endpoints": [{"endpoint": {
                "address": {"socket_address": {"address": EG_ADMIN[0], "port_value": EG_ADMIN[1]}}}}]}]},
        }),
        add(CLUSTER_TYPE, WASM_SOURCE_CLUSTER, "", wasm_source_cluster(args)),
    ]
    if args.peer_port:
        patches += [
            # The peer port: an address of the listener the filter runs on (the filter answers the
            # peer path only there). Envoy Gateway's listener has no additional_addresses of its
            # own (internal/xds/translator/listener.go; dual stack binds :: with ipv4_compat).
            add(LISTENER_TYPE, listener, "/additional_addresses", [ig.peer_address(args.peer_port)]),
            add(CLUSTER_TYPE, ig.PEERS_CLUSTER, "", peers_cluster(args)),
        ]
    return {
        "apiVersion": "gateway.envoyproxy.io/v1alpha1",
        "kind": "EnvoyPatchPolicy",
        "metadata": {"name": "warmroute", "namespace": gw_ns, "labels": labels()},
        "spec": {
            "targetRef": {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": gw_name},
            "type": "JSONPatch",
            "jsonPatches": patches,
        },
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--namespace", required=True, help="namespace of the vLLM Service and its pods")
    p.add_argument("--service", default="vllm", help="the vLLM (ClusterIP) Service")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--max-backends", type=int, default=64, help="most pods routed over at once (pool.max_backends)")
    p.add_argument("--models", default="", help="comma-separated models every pod serves")
    p.add_argument("--adapters", default="", help="comma-separated LoRA adapters every pod can load")
    p.add_argument("--gateway", default=None, help="<ns>/<name> of the Gateway (default <namespace>/warmroute)")
    p.add_argument("--gateway-class", default="eg", help="the Gateway's gatewayClassName (Envoy Gateway's)")
    p.add_argument("--external-host", default="llm.example.com")
    p.add_argument("--wasm-url", required=True, help="http(s) URL the gateway's Envoy fetches dist/warmroute.wasm from")
    p.add_argument("--wasm-sha256", required=True, help="sha256 of that file (sha256sum dist/warmroute.wasm)")
    p.add_argument("--config", help="JSON file merged over the generated pluginConfig, checked by the filter's parser")
    p.add_argument("--peer-port", type=int, default=None,
                   help="the exchange between the gateway's replicas: the port (e.g. 15099) each replica serves "
                        "its recent index events on, to the other replicas only; adds peers.yaml, "
                        "networkpolicy-peers.yaml and the peers cluster")
    p.add_argument("--proxy-namespace", default=None,
                   help=f"with --peer-port: where Envoy Gateway runs the gateway's proxies (default {PROXY_NAMESPACE}, "
                        "its controller's namespace; the Gateway's with gatewayNamespaceMode)")
    p.add_argument("--out", default=os.path.join(HERE, "generated"))
    args = p.parse_args(argv)

    for flag, v in (("--service", args.service), ("--namespace", args.namespace)):
        if not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", v):
            p.error(f"{flag} must be a DNS-1123 label")
    args.gateway = args.gateway or f"{args.namespace}/warmroute"
    if not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?/[a-z0-9]([-a-z0-9]*[a-z0-9])?", args.gateway):
        p.error("--gateway must be <namespace>/<name>")
    m = re.fullmatch(r"(?:sha256:)?([0-9a-f]{64})", args.wasm_sha256)
    if not m:
        p.error("--wasm-sha256 must be the 64 lower-case hex digits of sha256sum dist/warmroute.wasm")
    args.wasm_sha256 = m.group(1)
    u = urllib.parse.urlsplit(args.wasm_url)
    if u.scheme not in ("http", "https") or not u.hostname or u.username or u.password:
        p.error("--wasm-url must be http(s)://host[:port]/path (no credentials)")
    if not 1 <= args.max_backends <= 1024:
        p.error("--max-backends must be in 1..=1024 (the filter's slot limit)")
    if args.peer_port is None:
        if args.proxy_namespace is not None:
            p.error("--proxy-namespace is for --peer-port")
    else:
        args.proxy_namespace = args.proxy_namespace or PROXY_NAMESPACE
        if not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", args.proxy_namespace):
            p.error("--proxy-namespace must be a DNS-1123 label")
        if len(peers_service_name(args)) > 63:
            p.error(f"--gateway: the peers Service name {peers_service_name(args)} is over 63 characters")
        if not 1024 <= args.peer_port <= 65535:
            p.error("--peer-port must be in 1024-65535 (an unprivileged port the proxies can bind)")
        # Envoy Gateway binds a Gateway listener's port, or port + 10000 under 1024
        # (internal/gatewayapi/listener.go servicePortToContainerPort).
        taken = {ig.GATEWAY_PORT, ig.GATEWAY_PORT + 10000, *EG_PORTS}
        if args.peer_port in taken:
            p.error(f"--peer-port {args.peer_port} is a port the gateway's proxies already use ({', '.join(map(str, sorted(taken)))})")

    # The filter configuration istio/generate.py writes for endpoint mode, on Envoy Gateway's cluster.
    iargs = argparse.Namespace(route_mode="endpoint", service=args.service, namespace=args.namespace, port=args.port,
                               max_backends=args.max_backends, models=ig.names(p, "--models", args.models),
                               adapters=ig.names(p, "--adapters", args.adapters), pod_ips=[])
    config = ig.plugin_config(iargs)
    config["pool"]["cluster"] = pool_cluster(args)
    if args.peer_port:
        config = {k: v for k, v in config.items() if k != "debug_header"}
        config["peers"] = {"cluster": ig.PEERS_CLUSTER, "port": args.peer_port, "admin_cluster": ig.ADMIN_CLUSTER}
        config["debug_header"] = False
    if args.config:
        config = ig.merge(config, ig.read_overrides(p, args.config))
        # Checked under Istio's buffers (1 MiB listener), stricter than Envoy Gateway's 32 KiB;
        # check.mjs checks it again under the gateway's own.
        ig.check_config(p, config, args.config)

    shown, skip = [], False
    for a in (argv if argv is not None else sys.argv[1:]):
        if skip:
            skip = False
        elif a == "--out":
            skip = True
        elif not a.startswith("--out="):
            shown.append(a)
    banner = BANNER.format(argv=" ".join(shown))
    files = {
        "gatewayclass.yaml": banner + ig.documents([gateway_class(args)]),
        "gateway.yaml": banner + ig.documents([gateway(args)]),
        "httproute.yaml": banner + ig.documents([http_route(args)]),
        "envoypatchpolicy.yaml": banner + ig.documents([patch_policy(args, config)]),
        "envoyproxy.yaml": banner + ig.documents([envoy_proxy(args)]),
        "pluginconfig.json": json.dumps(config, indent=2) + "\n",
    }
    if args.peer_port:
        files["peers.yaml"] = banner + ig.documents([ig.peers_service(
            peers_service_name(args), args.proxy_namespace, proxy_selector(args), args.peer_port, labels())])
        files["networkpolicy-peers.yaml"] = banner + ig.NETPOL_NOTE + ig.documents([ig.peers_network_policy(
            peers_service_name(args), args.proxy_namespace, proxy_selector(args), args.peer_port, labels())])
    os.makedirs(args.out, exist_ok=True)
    for name, text in files.items():
        with open(os.path.join(args.out, name), "w", encoding="utf-8", newline="\n") as f:
            f.write(text)
    print(f"generate.py: wrote {', '.join(sorted(files))} to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
