// Cross-checks between warmroute's Istio manifests that no schema can express:
//  - every WasmPlugin's spec.pluginConfig and every generated EnvoyFilter's embedded JSON
//    equals istio/generated/pluginconfig.json (no hand-copied drift);
//  - the filter itself accepts each plugin config (../filter-verdict.mjs: warmroute-check-config,
//    the core's Config::parse, on each copy as Envoy hands it over);
//  - max_body_bytes fits the Envoy buffers it runs under (--buffer-limits): the VIRTUAL_HOST/
//    LISTENER patches of the EnvoyFilters selecting the workload the filter runs in, over
//    Envoy's 1 MiB default (Istio sets no listener limit);
//  - every EnvoyFilter selects a workload warmroute runs in (the ingress gateway, a client
//    sidecar) and patches only that workload's context, and each such workload gets the strict
//    scrape cluster metrics.cluster names (EDS from istiod under the vLLM Service's outbound
//    cluster name, override_host with a fallback that picks no host), the strip of client
//    routing headers (route.model_header too, if set; at the gateway also the gate's class and
//    deadline headers) and, in endpoint mode, the override_host policy on the vLLM cluster; the
//    scrape cluster speaks Istio mTLS (SDS `default`/`ROOTCA` from sds-grpc) to endpoints marked
//    tlsMode: istio and plain text to the rest, as Istio's own outbound cluster does;
//  - a discovered pool (pluginConfig `pool`): route.mode endpoint, pool.cluster is the vLLM
//    Service's outbound cluster (the one each workload's override_host policy is merged into),
//    and each workload gets pool.admin_cluster as a STATIC cluster of the proxy's admin
//    (127.0.0.1:15000) in its own EnvoyFilters;
//  - no route reaches the proxy's admin: no EnvoyFilter patch (but the cluster's own ADD),
//    VirtualService or ServiceEntry names an admin cluster or points at the admin's address, no
//    patch has a cluster_header route, and no cluster is added at the admin's address under a
//    name the filter does not read;
//  - the exchange between the gateway's replicas (pluginConfig `peers`): it runs in gateways only;
//    each gets the peers cluster (EDS from istiod under the outbound name of a headless Service
//    selecting exactly the gateway's pods on peers.port, override_host with a fallback that picks
//    no host, plain text) and the peer port as an additional address of one listener (matched by
//    port, never the port itself), peers.admin_cluster as the proxy's admin; no Gateway server or
//    other Service faces clients with the port, no route names the peers cluster, and a
//    NetworkPolicy selecting the gateway's pods admits the port from them only
//    (../peers-check.mjs);
//  - no VirtualService binds both a Gateway and `mesh`, and one bound to `mesh` is exported only
//    to namespaces whose sidecars run warmroute;
//  - header mode: each backend name has a DestinationRule subset and, in every VirtualService,
//    a header match routing to it (a missing one is a 503 "no healthy upstream" in production).
//
//   WARMROUTE_CHECK_CONFIG=path/to/warmroute-check-config node check-warmroute.mjs ISTIO_DIR
import fs from "node:fs";
import path from "node:path";
import { isDeepStrictEqual } from "node:util";
import { parseAllDocuments } from "yaml";
import { bodyLimit, ENVOY_DEFAULT_BUFFER, verdicts } from "../filter-verdict.mjs";
import { additionalPorts, noClientService, peerNetworkPolicies, peerServices } from "../peers-check.mjs";

const [dir, ...extra] = process.argv.slice(2);
const checker = process.env.WARMROUTE_CHECK_CONFIG;
if (!dir || extra.length || !checker) {
  console.error("usage: WARMROUTE_CHECK_CONFIG=BIN node check-warmroute.mjs ISTIO_DIR");
  process.exit(2);
}
let failed = 0;
const fail = (m) => { failed++; console.log(`FAIL ${m}`); };
const ok = (m) => console.log(`ok   ${m}`);

const load = (f) => parseAllDocuments(fs.readFileSync(f, "utf8"), { merge: true })
  .map((d) => d.toJS({ maxAliasCount: 100 })).filter(Boolean);
const yamls = (d) => fs.readdirSync(d).filter((f) => f.endsWith(".yaml")).map((f) => path.join(d, f));
const gen = path.join(dir, "generated");
const all = [...yamls(dir), ...yamls(gen)].flatMap((f) => load(f).map((o) => ({ f, o })));
const ref = JSON.parse(fs.readFileSync(path.join(gen, "pluginconfig.json"), "utf8"));
const ENDPOINT_HEADER = "x-gateway-destination-endpoint";
const BACKEND_HEADER = "x-warmroute-backend";
// What a client may not set at the gateway (istio/generate.py, stripped_headers): the gate's
// class and deadline (the filter's default names unless the pluginConfig sets others) and the
// Inference Extension's objective, which the gate reads as a class.
const GATE_HEADERS = (gate) => [gate?.header ?? "x-warmroute-priority", "x-gateway-inference-objective",
  gate?.deadline_header ?? "x-warmroute-deadline-ms"].map((h) => h.toLowerCase());

// A workload is what an EnvoyFilter's workloadSelector or a WasmPlugin's selector picks in its
// namespace; objects with equal keys patch the same proxies.
const labelsKey = (labels) => JSON.stringify(Object.entries(labels ?? {}).sort());
const workloadOf = (o) => {
  const labels = o.kind === "WasmPlugin" ? o.spec?.selector?.matchLabels : o.spec?.workloadSelector?.labels;
  return `${o.metadata?.namespace ?? "default"} ${labelsKey(labels)}`;
};
const envoyFilters = all.filter(({ o }) => o.kind === "EnvoyFilter");
const patchesOf = (key) => envoyFilters.filter(({ o }) => workloadOf(o) === key)
  .flatMap(({ f, o }) => (o.spec?.configPatches ?? []).map((p) => ({ f, p })));
// Istio's gateways are the proxies a Gateway selects; any other workload is a sidecar.
// A gateway.networking.k8s.io Gateway's pods are the ones Istio deploys for it, labelled with its
// name (istio-discovery files/kube-gateway.yaml); an Istio Gateway names its pods' labels.
const GATEWAY_NAME_LABEL = "gateway.networking.k8s.io/gateway-name";
const isGatewayAPI = (o) => String(o.apiVersion ?? "").startsWith("gateway.networking.k8s.io/");
const gatewayObjects = all.filter(({ o }) => o.kind === "Gateway").map(({ f, o }) => ({
  f, o, labels: isGatewayAPI(o) ? { [GATEWAY_NAME_LABEL]: o.metadata?.name } : o.spec?.selector,
  // [port, protocol, [hosts]] of each server or listener.
  servers: isGatewayAPI(o)
    ? (o.spec?.listeners ?? []).map((l) => [Number(l.port), l.protocol, [l.hostname ?? "*"]])
    : (o.spec?.servers ?? []).map((sv) => [Number(sv.port?.number), sv.port?.protocol, (sv.hosts ?? []).map((h) => h.split("/").pop())]),
}));
const gatewaySelectors = new Set(gatewayObjects.map((g) => labelsKey(g.labels)));
const contextFor = (o) => {
  const labels = o.kind === "WasmPlugin" ? o.spec?.selector?.matchLabels : o.spec?.workloadSelector?.labels;
  return gatewaySelectors.has(labelsKey(labels)) ? "GATEWAY" : "SIDECAR_OUTBOUND";
};

// ---- the filter's own verdict: each config as Envoy hands it over (JSON text)
const { verdict: contract, close } = verdicts(checker, ok, fail);
contract(ref, "generated/pluginconfig.json");

// [body, listener] buffer limits of the proxies o's filter runs in: the VIRTUAL_HOST and
// LISTENER patches of every EnvoyFilter selecting that workload, over Envoy's defaults.
function workloadBuffers(o) {
  const patches = patchesOf(workloadOf(o)).map(({ p }) => p);
  const listener = Number(patches.find((q) => q.applyTo === "LISTENER")?.patch?.value?.per_connection_buffer_limit_bytes
    ?? ENVOY_DEFAULT_BUFFER);
  const vhosts = patches.filter((q) => q.applyTo === "VIRTUAL_HOST").map((q) => q.patch?.value ?? {});
  return [bodyLimit(vhosts.length ? vhosts : [{}], listener), listener];
}

// ---- every embedded copy equals the generated one
for (const { f, o } of all) {
  const rel = path.relative(dir, f);
  if (o.kind === "WasmPlugin") {
    if (isDeepStrictEqual(o.spec?.pluginConfig, ref)) ok(`${rel}: pluginConfig == generated/pluginconfig.json`);
    else fail(`${rel}: spec.pluginConfig differs from generated/pluginconfig.json (re-run generate.py and copy it)`);
    contract(o.spec?.pluginConfig ?? {}, `${rel} pluginConfig`, workloadBuffers(o));
  }
  if (o.kind === "EnvoyFilter") {
    for (const p of o.spec?.configPatches ?? []) {
      const cfg = p.patch?.value?.typed_config?.config;
      if (p.applyTo !== "EXTENSION_CONFIG" || !cfg) continue;
      contract(cfg.configuration?.value ?? "", `${rel} configuration`, workloadBuffers(o));
      let embedded;
      try { embedded = JSON.parse(cfg.configuration?.value ?? "null"); } catch (e) { fail(`${rel}: configuration.value is not JSON: ${e.message}`); continue; }
      if (isDeepStrictEqual(embedded, ref)) ok(`${rel}: embedded configuration == generated/pluginconfig.json`);
      else fail(`${rel}: embedded configuration differs from generated/pluginconfig.json`);
      if (cfg.allow_on_headers_stop_iteration !== true) fail(`${rel}: allow_on_headers_stop_iteration must be true`);
      else ok(`${rel}: allow_on_headers_stop_iteration: true`);
      const digest = cfg.vm_config?.code?.remote?.sha256;
      const uri = cfg.vm_config?.code?.remote?.http_uri?.uri ?? "";
      if (cfg.vm_config?.code?.remote && !/^[0-9a-f]{64}$/.test(digest ?? "")) {
        fail(`${rel}: the remote module has no sha256 digest (${digest}): a moved tag would swap the code`);
      } else if (uri.startsWith("oci://") && uri.match(/@sha256:([0-9a-f]{64})$/)?.[1] !== digest) {
        // istio-agent pulls the manifest the uri names and compares its digest with sha256
        // (pkg/wasm/cache.go): an oci:// uri not pinned to that same digest never loads, or
        // loads whatever the tag points at.
        fail(`${rel}: uri ${uri} is not pinned to @sha256:${digest}, the digest istio-agent checks the image's manifest against`);
      } else ok(`${rel}: module pinned by sha256${uri.startsWith("oci://") ? " (uri pulls that manifest digest)" : ""}`);
      // The ECDS name must match the HTTP filter that references it.
      const names = (o.spec.configPatches ?? []).filter((q) => q.applyTo === "HTTP_FILTER").map((q) => q.patch?.value?.name);
      if (!names.includes(p.patch.value.name)) fail(`${rel}: no HTTP_FILTER references extension ${p.patch.value.name}`);
      // Until the extension config arrives (or while it is rejected), a default must stand in
      // without warming, or Envoy answers 500 for want of a filter config.
      for (const q of (o.spec.configPatches ?? []).filter((x) => x.patch?.value?.name === p.patch.value.name && x.applyTo === "HTTP_FILTER")) {
        const cd = q.patch.value.config_discovery ?? {};
        const type = cd.default_config?.["@type"];
        if (!type || cd.apply_default_config_without_warming !== true || !(cd.type_urls ?? []).includes(type)) {
          fail(`${rel}: ${q.patch.value.name} needs a default_config (in type_urls) applied without warming`);
        } else ok(`${rel}: ${q.patch.value.name} serves with ${type.split(".").pop()} until its config arrives`);
      }
    }
  }
}

// ---- the vLLM Service: the DestinationRule's host, the port of the VirtualServices' routes
const dr = all.find(({ o }) => o.kind === "DestinationRule")?.o;
const vss = all.filter(({ o }) => o.kind === "VirtualService");
const httpRoutes = all.filter(({ o }) => o.kind === "HTTPRoute");
const vllmHost = dr?.spec?.host;
const vllmPort = vss.flatMap(({ o }) => o.spec?.http ?? []).flatMap((r) => r.route ?? [])
  .map((d) => d.destination).find((d) => d?.host === vllmHost)?.port?.number
  ?? httpRoutes.flatMap(({ o }) => (o.spec?.rules ?? []).flatMap((r) => r.backendRefs ?? [])
    .map((b) => ({ host: `${b.name}.${b.namespace ?? o.metadata?.namespace}.svc.cluster.local`, port: b.port })))
    .find((b) => b.host === vllmHost)?.port;
if (!vllmHost || !vllmPort) fail("generated/ needs a DestinationRule and a VirtualService or HTTPRoute routing to its host and port");
const vllmCluster = `outbound|${vllmPort}||${vllmHost}`;

// ---- a discovered pool: the pods of the vLLM Service's own cluster, named by address
// The filter's defaults when the pool leaves them out.
const poolClusters = ref.pool ? (ref.pool.clusters?.length ? ref.pool.clusters.map((c) => c.cluster) : [ref.pool.cluster ?? "pool"]) : [];
const poolCluster = poolClusters.join(", ");
const adminCluster = ref.pool ? (ref.pool.admin_cluster ?? "envoy-admin") : undefined;
// The clusters the filter reads the proxy's admin through: the pool's, the peers' (the filter's
// default name when the section leaves it out).
const adminClusters = new Map([[adminCluster, "pool.admin_cluster"], [ref.peers ? (ref.peers.admin_cluster ?? "envoy-admin") : undefined, "peers.admin_cluster"]]
  .filter(([name]) => name !== undefined).reverse());
if (ref.pool) {
  const mode = ref.route?.mode ?? "endpoint";
  if (mode !== "endpoint") {
    fail(`pool with route.mode ${mode}: a pool's pods are named pod-<slot> and known by address, which only endpoint mode's override_host routes to`);
  }
  // One Service here: its cluster carries override_host and warmroute-metrics scrapes its pods
  // only, so a pod of any other cluster would get the filter's choice ignored and every scrape
  // refused.
  const others = poolClusters.filter((c) => c !== vllmCluster);
  if (others.length) {
    fail(`pool.cluster ${others.join(", ")} is not the vLLM Service's outbound cluster ${vllmCluster}: the filter would name pods that override_host on the Service's cluster, and the scrape cluster, do not have`);
  } else ok(`pool.cluster ${poolCluster}: the vLLM Service's outbound cluster`);
}

// ---- header mode: backend <-> subset <-> route, in every VirtualService
if ((ref.route?.mode ?? "endpoint") === "header" && dr) {
  const header = ref.route.header ?? BACKEND_HEADER;
  const subsets = new Set((dr.spec.subsets ?? []).map((s) => s.name));
  for (const { f, o: vs } of vss) {
    const where = `${path.relative(dir, f)} ${vs.metadata?.name}`;
    const routes = new Map();
    for (const r of vs.spec.http ?? []) {
      for (const m of r.match ?? []) {
        const v = m.headers?.[header]?.exact;
        if (v) routes.set(v, r.route?.[0]?.destination);
      }
    }
    for (const b of ref.backends) {
      const d = routes.get(b.name);
      if (!subsets.has(b.name)) fail(`backend ${b.name}: no DestinationRule subset of that name`);
      else if (!d) fail(`${where}: backend ${b.name}: no route matching ${header}: exact ${b.name}`);
      else if (d.subset !== b.name || d.host !== dr.spec.host) fail(`${where}: backend ${b.name}: route goes to ${d.host}/${d.subset}`);
      else ok(`${where}: ${header}: ${b.name} -> ${d.host} subset ${d.subset}`);
    }
    if (!(vs.spec.http ?? []).some((r) => !r.match)) fail(`${where}: no default (match-less) route for fail-open traffic`);
  }
}

// ---- where warmroute runs: each workload a Wasm EnvoyFilter or a WasmPlugin selects
const workloads = new Map(); // key -> { ns, context, by: [file] }
for (const { f, o } of all) {
  const wasm = o.kind === "WasmPlugin"
    || (o.kind === "EnvoyFilter" && (o.spec?.configPatches ?? []).some((p) => p.applyTo === "EXTENSION_CONFIG"));
  if (!wasm) continue;
  const key = workloadOf(o);
  const labels = o.kind === "WasmPlugin" ? o.spec?.selector?.matchLabels : o.spec?.workloadSelector?.labels;
  const w = workloads.get(key) ?? { ns: o.metadata?.namespace, labels, context: contextFor(o), by: [] };
  w.by.push(path.relative(dir, f));
  workloads.set(key, w);
}
const sidecarNamespaces = new Set([...workloads.values()].filter((w) => w.context === "SIDECAR_OUTBOUND").map((w) => w.ns));

// ---- every EnvoyFilter: one such workload, its context only
for (const { f, o } of envoyFilters) {
  const where = `${path.relative(dir, f)} ${o.metadata?.name}`;
  const labels = o.spec?.workloadSelector?.labels ?? {};
  if (!Object.keys(labels).length) {
    fail(`${where}: no workloadSelector: it patches every proxy in ${o.metadata?.namespace} (in the root namespace, the whole mesh)`);
    continue;
  }
  if (!workloads.has(workloadOf(o))) {
    fail(`${where}: selects ${JSON.stringify(labels)} in ${o.metadata?.namespace}, where warmroute does not run`);
    continue;
  }
  const want = contextFor(o);
  const stray = (o.spec.configPatches ?? []).map((p) => p.match?.context ?? "ANY").filter((c) => c !== want);
  if (stray.length) fail(`${where}: patches ${[...new Set(stray)].join(", ")} where its workload is ${want} only`);
  else ok(`${where}: ${o.metadata?.namespace} ${JSON.stringify(labels)}, ${want} only`);
}

// ---- what each workload needs beside the filter
// Istio's bootstrap puts the proxy's admin here (ProxyConfig proxyAdminPort, on localhost).
const PROXY_ADMIN_PORT = 15000;
const PROXY_ADMIN = `127.0.0.1:${PROXY_ADMIN_PORT}`;
const socketsOf = (v) => (v?.load_assignment?.endpoints ?? []).flatMap((e) => e.lb_endpoints ?? [])
  .map((e) => e.endpoint?.address?.socket_address).filter(Boolean);
const endpointsOf = (v) => socketsOf(v).map((a) => `${a.address}:${a.port_value}`);
// Addresses a proxy reaches its own loopback (and so its admin) by.
const isLoopback = (a) => /^(127\.|localhost$|::1$|\[::1\]$|0\.0\.0\.0$|::$)/i.test(String(a));
const lbPolicy = (v) => v?.load_balancing_policy?.policies?.[0]?.typed_extension_config?.typed_config;
const isOverrideHost = (t) => String(t?.["@type"] ?? "").endsWith(".override_host.v3.OverrideHost")
  && (t.override_host_sources ?? []).some((src) => src.header === ENDPOINT_HEADER);
// Why a cluster's policy may pick a host other than the one the header names, if it may.
function notStrict(v) {
  const t = lbPolicy(v);
  if (!isOverrideHost(t)) return `load_balancing_policy is not override_host from ${ENDPOINT_HEADER}`;
  const fb = t.fallback_policy?.policies?.[0]?.typed_extension_config?.typed_config;
  if (!String(fb?.["@type"] ?? "").endsWith(".subset.v3.Subset")) return `its fallback is ${fb?.["@type"] ?? "none"}, not a subset policy that picks no host`;
  if (fb.fallback_policy !== "NO_FALLBACK") return `its subset fallback_policy is ${fb.fallback_policy ?? "ANY_ENDPOINT (unset)"}, not NO_FALLBACK`;
  if (fb.panic_mode_any === true) return "panic_mode_any lets the fallback pick any host";
  if ((fb.subset_selectors ?? []).some((sel) => (sel.fallback_policy ?? "NOT_DEFINED") !== "NOT_DEFINED" && sel.fallback_policy !== "NO_FALLBACK")) {
    return "a subset selector has a fallback that picks a host";
  }
  return undefined;
}
// Why the scrape cluster would not reach a pod under PeerAuthentication STRICT, or one without a
// sidecar, if it would not: Istio's auto mTLS per endpoint (cluster_tls.go), the proxy's
// certificate `default` and the root CA `ROOTCA` from istio-agent's SDS (sds-grpc) to endpoints
// istiod marks tlsMode: istio, plain text to the rest.
const sdsCluster = (x) => x?.sds_config?.api_config_source?.grpc_services?.[0]?.envoy_grpc?.cluster_name;
function notIstioMtls(v) {
  if (v.transport_socket) return "a transport_socket for every endpoint, not Istio's per-endpoint transport_socket_matches";
  const m = v.transport_socket_matches ?? [];
  const i = m.findIndex((x) => x.match?.tlsMode === "istio");
  // Envoy takes the first entry that matches: a match-all before it would win every endpoint.
  if (m.slice(0, Math.max(i, 0)).some((x) => !Object.keys(x.match ?? {}).length)) {
    return "a match-all entry before tlsMode: istio: Envoy takes the first match, so no scrape would use TLS";
  }
  if (i < 0) return "no transport_socket_matches entry for tlsMode: istio endpoints: under PeerAuthentication STRICT every scrape fails";
  const t = m[i].transport_socket?.typed_config ?? {};
  if (!String(t["@type"] ?? "").endsWith(".tls.v3.UpstreamTlsContext")) return `tlsMode: istio: transport socket ${t["@type"] ?? "none"}, not an UpstreamTlsContext`;
  const c = t.common_tls_context ?? {};
  if (!(c.tls_certificate_sds_secret_configs ?? []).some((x) => x.name === "default" && sdsCluster(x) === "sds-grpc")) {
    return "tlsMode: istio: no certificate `default` from istio-agent (SDS over sds-grpc): a STRICT sidecar refuses the handshake";
  }
  const root = c.combined_validation_context?.validation_context_sds_secret_config ?? c.validation_context_sds_secret_config;
  if (root?.name !== "ROOTCA" || sdsCluster(root) !== "sds-grpc") return "tlsMode: istio: the pod's certificate is not checked against `ROOTCA` from istio-agent (SDS over sds-grpc)";
  const last = m[m.length - 1];
  const lastType = String(last?.transport_socket?.typed_config?.["@type"] ?? "");
  if (m.length - 1 === i || Object.keys(last.match ?? {}).length || !lastType.endsWith(".raw_buffer.v3.RawBuffer")) {
    return "no plain-text match-all after tlsMode: istio: scrapes of pods without a sidecar would use the cluster's default socket";
  }
  return undefined;
}
const removes = (p) => new Set((p.patch?.value?.typed_config?.early_header_mutation_extensions ?? [])
  .flatMap((e) => e.typed_config?.mutations ?? []).map((m) => m.remove).filter(Boolean));

if (/^(outbound|inbound)\|/.test(ref.metrics?.cluster ?? "")) {
  fail(`metrics.cluster ${ref.metrics.cluster} is one of Istio's own clusters: its fallback answers a stale address with another pod's /metrics`);
}
for (const [key, w] of workloads) {
  const who = `${w.context === "GATEWAY" ? "gateway" : "sidecar"} ${w.ns} ${JSON.stringify(w.labels ?? {})}`;
  const patches = patchesOf(key);
  if (ref.metrics?.enabled !== false) {
    const adds = patches.filter(({ p }) => p.applyTo === "CLUSTER" && p.patch?.operation === "ADD" && p.patch?.value?.name === ref.metrics.cluster);
    if (adds.length !== 1) fail(`${who}: ${adds.length} EnvoyFilter CLUSTER ADD of metrics.cluster ${ref.metrics.cluster}, need exactly 1`);
    else {
      const { f, p } = adds[0];
      const v = p.patch.value;
      const eds = v.eds_cluster_config ?? {};
      const why = v.type !== "EDS" ? `type ${v.type}, not EDS`
        : eds.service_name !== vllmCluster ? `EDS service_name ${eds.service_name}, not the vLLM Service's ${vllmCluster}`
        : (typeof eds.eds_config?.ads !== "object" || eds.eds_config?.resource_api_version !== "V3") ? "its endpoints do not come from istiod (eds_config: {ads: {}, resource_api_version: V3})"
        : notStrict(v) ?? notIstioMtls(v);
      if (why) fail(`${path.relative(dir, f)}: ${ref.metrics.cluster}: ${why}`);
      else ok(`${who}: ${ref.metrics.cluster}: ${vllmCluster}'s endpoints, a scrape reaches the header's pod or fails, over Istio mTLS to pods with a sidecar`);
    }
  }
  const model = ref.route?.model_header ? [ref.route.model_header.toLowerCase()] : [];
  const trusted = [ENDPOINT_HEADER, BACKEND_HEADER, ...model, ...(w.context === "GATEWAY" ? GATE_HEADERS(ref.gate) : [])];
  const strips = patches.filter(({ p }) => p.applyTo === "NETWORK_FILTER" && trusted.every((h) => removes(p).has(h)));
  if (!strips.length) fail(`${who}: no EnvoyFilter drops client copies of ${trusted.join(", ")} (early header mutation)`);
  else ok(`${who}: Envoy drops client copies of ${trusted.join(", ")}`);
  const policies = patches.filter(({ p }) => p.applyTo === "CLUSTER" && p.patch?.operation === "MERGE" && isOverrideHost(lbPolicy(p.patch?.value)));
  for (const { f, p } of policies) {
    const c = p.match?.cluster ?? {};
    if (c.service !== vllmHost || Number(c.portNumber) !== vllmPort || c.name || c.subset) {
      fail(`${path.relative(dir, f)}: override_host merged into ${JSON.stringify(c)}, not the vLLM cluster ${vllmHost}:${vllmPort}`);
    }
  }
  if ((ref.route?.mode ?? "endpoint") === "endpoint") {
    const on = ref.pool ? `pool.cluster ${poolCluster}` : "the vLLM cluster";
    if (!policies.length) fail(`${who}: endpoint mode, but no override_host policy on ${on}: the filter's choice would be ignored`);
    else ok(`${who}: override_host policy on ${vllmHost}:${vllmPort}`);
  }
  for (const [name, field] of adminClusters) {
    if (field === "peers.admin_cluster" && w.context !== "GATEWAY") continue; // refused below
    const adds = patches.filter(({ p }) => p.applyTo === "CLUSTER" && p.patch?.operation === "ADD" && p.patch?.value?.name === name);
    const without = field === "pool.admin_cluster" ? "the filter never learns a pod" : "the filter never learns a peer";
    if (adds.length !== 1) fail(`${who}: ${adds.length} EnvoyFilter CLUSTER ADD of ${field} ${name}, need exactly 1: without it ${without}`);
    else {
      const { f, p } = adds[0];
      const v = p.patch.value;
      const eps = endpointsOf(v);
      const why = v.type !== "STATIC" ? `type ${v.type ?? "unset"}, not STATIC`
        : (eps.length !== 1 || eps[0] !== PROXY_ADMIN) ? `endpoints ${JSON.stringify(eps)}, not the proxy's admin ${PROXY_ADMIN} alone`
        : v.transport_socket || v.transport_socket_matches ? "a transport socket: the admin speaks plain HTTP"
        : undefined;
      if (why) fail(`${path.relative(dir, f)}: ${name}: ${why}`);
      else ok(`${who}: ${name}: STATIC ${PROXY_ADMIN}, the proxy's own admin`);
    }
  }
}

// ---- the admin cluster: named by the filter's configuration and its own definition only
// Any route to it hands the proxy's admin to clients, every path and POSTs included
// (POST /quitquitquit stops the proxy). Admin clusters are the pool's and any cluster added with
// the admin's address; every string naming one, anywhere but in its own definition, is refused
// (a route's cluster, weighted_clusters, a mirror, a VirtualService destination), and so is a
// cluster_header route, which lets the client name any cluster.
const admins = new Set(adminClusters.keys());
for (const { f, o } of envoyFilters) {
  for (const p of o.spec?.configPatches ?? []) {
    const v = p.patch?.value;
    if (p.applyTo !== "CLUSTER" || p.patch?.operation !== "ADD" || !v?.name) continue;
    const toAdmin = socketsOf(v).some((a) => isLoopback(a.address) && Number(a.port_value) === PROXY_ADMIN_PORT);
    if (toAdmin) admins.add(v.name);
    if (toAdmin && !adminClusters.has(v.name)) {
      fail(`${path.relative(dir, f)}: cluster ${v.name} points at the proxy's admin, but the filter reads none by that name (${[...adminClusters].map(([n, k]) => `${k} ${n}`).join(", ") || "no admin cluster set"})`);
    }
  }
}
function* strings(v, at) {
  if (typeof v === "string") yield [at, v, undefined];
  else if (Array.isArray(v)) for (const [i, x] of v.entries()) yield* strings(x, `${at}[${i}]`);
  else if (v && typeof v === "object") {
    for (const [k, x] of Object.entries(v)) {
      if (k === "cluster_header") yield [`${at}.${k}`, x, k];
      yield* strings(x, `${at}.${k}`);
    }
  }
}
const peersCluster = ref.peers?.cluster;
const failedBefore = failed;
let scanned = 0;
for (const { f, o } of all.filter(({ o }) => ["EnvoyFilter", "VirtualService", "ServiceEntry"].includes(o.kind))) {
  const where = `${path.relative(dir, f)} ${o.kind} ${o.metadata?.name}`;
  const parts = o.kind === "EnvoyFilter" ? (o.spec?.configPatches ?? []).map((p, i) => [`configPatches[${i}]`, p]) : [["spec", o.spec]];
  for (const [at, part] of parts) {
    if (o.kind === "EnvoyFilter" && part.applyTo === "CLUSTER" && part.patch?.operation === "ADD"
      && (admins.has(part.patch?.value?.name) || part.patch?.value?.name === peersCluster)) continue;
    for (const [loc, value, key] of strings(part, at)) {
      if (key === "cluster_header" && admins.size) fail(`${where}: ${loc}: a cluster_header route lets the client name any cluster, ${[...admins].join(", ")} included`);
      else if (admins.has(value)) fail(`${where}: ${loc} names the admin cluster ${value}: no route may reach the proxy's admin`);
      else if (value === peersCluster) fail(`${where}: ${loc} names the peers cluster ${value}: a route to it hands clients the replicas' events (the pull arrives on the peer port)`);
    }
    // Istio routes name services, not clusters: a ServiceEntry whose endpoints are the proxy's
    // loopback admin would make one that routes there.
    if (o.kind === "ServiceEntry") {
      for (const e of part?.endpoints ?? []) {
        const ports = Object.values(e.ports ?? {}).map(Number);
        const seports = (part.ports ?? []).map((q) => Number(q.targetPort ?? q.number));
        if (isLoopback(e.address) && [...ports, ...seports].includes(PROXY_ADMIN_PORT)) {
          fail(`${where}: an endpoint at ${e.address}, port ${PROXY_ADMIN_PORT}: a route to this service reaches the proxy's admin`);
        }
      }
    }
  }
  scanned++;
}
if (admins.size && failed === failedBefore) {
  ok(`no route among ${scanned} EnvoyFilters, VirtualServices and ServiceEntries reaches ${[...admins, ...(peersCluster ? [peersCluster] : [])].join(", ")}`);
}

// ---- the exchange between the gateway's replicas: the peers cluster, the peer port, its Service
if (ref.peers) {
  const port = Number(ref.peers.port);
  for (const [key, w] of workloads) {
    const who = `${w.context === "GATEWAY" ? "gateway" : "sidecar"} ${w.ns} ${JSON.stringify(w.labels ?? {})}`;
    if (w.context !== "GATEWAY") {
      fail(`${who}: pluginConfig has peers, but the exchange is between a gateway's replicas: a sidecar has no peers cluster`);
      continue;
    }
    const patches = patchesOf(key);
    // The peers cluster: the replicas' peer ports from istiod, a pull reaching its replica or failing.
    const adds = patches.filter(({ p }) => p.applyTo === "CLUSTER" && p.patch?.operation === "ADD" && p.patch?.value?.name === peersCluster);
    if (adds.length !== 1) fail(`${who}: ${adds.length} EnvoyFilter CLUSTER ADD of peers.cluster ${peersCluster}, need exactly 1: without it no replica is pulled`);
    else {
      const { f, p } = adds[0];
      const v = p.patch.value;
      const eds = v.eds_cluster_config ?? {};
      const m = /^outbound\|(\d+)\|\|(.+)$/.exec(eds.service_name ?? "");
      const why = v.type !== "EDS" ? `type ${v.type}, not EDS`
        : !m ? `EDS service_name ${eds.service_name}, not the outbound cluster of a Service (outbound|<port>||<host>)`
        : Number(m[1]) !== port ? `EDS service_name ${eds.service_name}: port ${m[1]}, not peers.port ${port}`
        : (typeof eds.eds_config?.ads !== "object" || eds.eds_config?.resource_api_version !== "V3") ? "its endpoints do not come from istiod (eds_config: {ads: {}, resource_api_version: V3})"
        : (v.transport_socket || v.transport_socket_matches) ? "a transport socket: the peer port is the gateway's own listener, in plain text"
        : notStrict(v);
      if (why) fail(`${path.relative(dir, f)}: ${peersCluster}: ${why}`);
      else {
        ok(`${who}: ${peersCluster}: ${eds.service_name}'s endpoints, a pull reaches the replica named or fails`);
        const [oks, fails] = peerServices(all, { namespace: w.ns, podLabels: w.labels ?? {}, port, host: m[2], who });
        oks.forEach(ok); fails.forEach(fail);
      }
    }
    // The peer port: an additional address of one listener of the gateway's, the one the filter runs on.
    const merges = patches.filter(({ p }) => p.applyTo === "LISTENER" && p.patch?.operation === "MERGE" && additionalPorts(p.patch?.value).length);
    const onPort = merges.filter(({ p }) => additionalPorts(p.patch.value).includes(port));
    for (const { f, p } of merges.filter((x) => !onPort.includes(x))) {
      fail(`${path.relative(dir, f)}: LISTENER MERGE adds port ${additionalPorts(p.patch.value).join(", ")}, not peers.port ${port}: the filter answers peers on ${port} only`);
    }
    if (onPort.length !== 1) fail(`${who}: ${onPort.length} EnvoyFilter LISTENER MERGE adding peers.port ${port} as an additional address, need exactly 1`);
    else {
      const { f, p } = onPort[0];
      const lp = Number(p.match?.listener?.portNumber ?? 0);
      const servers = gatewayObjects.filter((g) => labelsKey(g.labels) === labelsKey(w.labels)).flatMap((g) => g.servers.map(([sp]) => sp));
      const why = !lp ? "matches no listener port: it would add the same address to every listener of the gateway, and the second bind fails the update"
        : lp === port ? `matches the listener on ${lp}, the peer port itself`
        : (p.match?.listener?.filterChain || p.match?.listener?.name) ? "matches more than the listener's port (a filter chain or name Istio may not generate)"
        : undefined;
      if (why) fail(`${path.relative(dir, f)}: LISTENER MERGE of the peer port ${why}`);
      else ok(`${who}: the peer port ${port} added to the listener on ${lp}${servers.includes(lp) ? "" : " (the server's targetPort)"}`);
    }
    // Nothing in front of clients carries the port: no Gateway server, no other Service.
    for (const g of gatewayObjects.filter((g) => labelsKey(g.labels) === labelsKey(w.labels))) {
      if (g.servers.some(([sp]) => sp === port)) fail(`${path.relative(dir, g.f)} Gateway ${g.o.metadata?.name}: a server on the peer port ${port}: clients would reach it${isGatewayAPI(g.o) ? " (Istio puts every listener's port on the Gateway's Service)" : ""}`);
    }
    for (const check of [noClientService, peerNetworkPolicies]) {
      const [oks, fails] = check(all, { namespace: w.ns, podLabels: w.labels ?? {}, port, who });
      oks.forEach(ok); fails.forEach(fail);
    }
  }
}

// ---- VirtualServices: the Gateway's, and the sidecars' exported to their namespaces only
for (const { f, o: vs } of vss) {
  const where = `${path.relative(dir, f)} ${vs.metadata?.name}`;
  const gateways = vs.spec?.gateways?.length ? vs.spec.gateways : ["mesh"];
  if (!gateways.includes("mesh")) { ok(`${where}: bound to ${gateways.join(", ")} only`); continue; }
  const exportTo = (vs.spec.exportTo ?? []).map((n) => (n === "." ? vs.metadata?.namespace : n));
  const others = exportTo.filter((n) => !sidecarNamespaces.has(n));
  if (gateways.length > 1) fail(`${where}: binds ${gateways.join(", ")}: its routes apply in every sidecar it is exported to, not only the Gateway`);
  else if (!exportTo.length || others.length) {
    fail(`${where}: bound to mesh and exported to ${exportTo.length ? others.join(", ") : "every namespace"}, whose sidecars do not run warmroute`);
  } else ok(`${where}: mesh routes exported to ${exportTo.join(", ")} only`);
}

// ---- HTTPRoutes: the Gateway's only. A Service parentRef (Gateway API for the mesh) puts the
// route in every sidecar that calls the Service, where no filter strips the routing headers.
for (const { f, o } of httpRoutes) {
  const where = `${path.relative(dir, f)} ${o.metadata?.name}`;
  const parents = o.spec?.parentRefs ?? [];
  const mesh = parents.filter((r) => (r.kind ?? "Gateway") !== "Gateway");
  if (!parents.length) fail(`${where}: no parentRefs: attached to no Gateway`);
  else if (mesh.length) fail(`${where}: parentRef ${mesh.map((r) => `${r.kind}/${r.name}`).join(", ")}: a mesh route, applied in sidecars that run no warmroute`);
  else ok(`${where}: attached to Gateway ${parents.map((r) => `${r.namespace ?? o.metadata?.namespace}/${r.name}`).join(", ")} only`);
}

// ---- the gateway's body buffer reaches its routes. A routeConfiguration.gateway match selects
// HTTPS servers' routes only: Istio names a plain-HTTP server's routes http.<port>, without the
// gateway (envoyfilter/rc_patch.go, model.ParseGatewayRDSRouteName), so such a patch never
// applies there. A vhost match must name a host:port a server of the gateway serves.
for (const g of gatewayObjects) {
  const key = `${g.o.metadata?.namespace ?? "default"} ${labelsKey(g.labels)}`;
  const vhostPatches = patchesOf(key).filter(({ p }) => p.applyTo === "VIRTUAL_HOST");
  const served = new Set(g.servers.flatMap(([port, , hosts]) => hosts.map((h) => `${h}:${port}`)));
  for (const { f, p } of vhostPatches) {
    const rc = p.match?.routeConfiguration ?? {};
    const where = `${path.relative(dir, f)}: VIRTUAL_HOST ${JSON.stringify(rc)}`;
    const onPort = g.servers.filter(([port]) => !rc.portNumber || port === Number(rc.portNumber));
    if (rc.gateway && onPort.every(([, proto]) => String(proto).toUpperCase() !== "HTTPS")) {
      fail(`${where}: routeConfiguration.gateway matches no plain-HTTP server's routes (Istio names them http.<port>)`);
    } else if (!onPort.length) fail(`${where}: the gateway serves nothing on port ${rc.portNumber}`);
    else if (rc.vhost?.name && !served.has(rc.vhost.name)) fail(`${where}: no virtual host ${rc.vhost.name} (the gateway serves ${[...served].join(", ")})`);
    else ok(`${where}: matches the gateway's routes`);
  }
}

close();
process.exit(failed ? 1 : 0);
