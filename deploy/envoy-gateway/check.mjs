// warmroute's Envoy Gateway objects (deploy/envoy-gateway/generate.py), checked offline.
//
//  1. every EnvoyPatchPolicy against a schema of Envoy Gateway's v1alpha1 API written here
//     (envoypatchpolicy.schema.json: EnvoyPatchPolicySpec, EnvoyJSONPatchConfig,
//     JSONPatchOperation), strict: a field the API does not declare is refused, as
//     `kubectl apply --validate=strict` would;
//  2. its JSON patches applied, as Envoy Gateway applies them (RFC 6902 on the resource's
//     proto-JSON, internal/xds/translator/jsonpatch.go), to stand-ins of the xDS Envoy Gateway
//     generates for the Gateway and HTTPRoute beside it: listener and route configuration
//     <gw-ns>/<gw>/<listener>, one EDS cluster httproute/<ns>/<name>/rule/<i> per rule, its
//     bootstrap (admin at 127.0.0.1:19000, xds_cluster, prometheus_stats). A patch naming a
//     resource the stand-ins lack, or a path whose parent does not exist, fails here as it fails
//     there. The result goes to `envoy --mode validate`;
//  3. the filter as patched in: allow_on_headers_stop_iteration true, the module pinned by
//     sha256 and fetched through a cluster that exists, its configuration equal to
//     generated/pluginconfig.json and accepted by the filter itself (warmroute-check-config
//     --shipped, with the body and listener buffer limits it runs under); pool.cluster an
//     HTTPRoute rule's cluster with the override_host policy; metrics.cluster an EDS cluster
//     of the same endpoints that never falls back to another pod; pool.admin_cluster the proxy's
//     admin; both routing headers stripped early; no route to the admin cluster;
//  3b. the exchange between the gateway's replicas (pluginConfig `peers`, generate.py --peer-port):
//     the peer port an additional address of the listener the filter runs on, on no port of the
//     Gateway's listeners (their Service faces clients); peers.cluster strict (override_host, no
//     fallback host), plain text, STRICT_DNS of a headless Service here in the proxies' namespace
//     selecting exactly this Gateway's proxy pods (Envoy Gateway's labels) on the peer port (Envoy
//     Gateway serves EDS for its own clusters only); peers.admin_cluster the proxy's admin; no
//     route to the peers cluster; a NetworkPolicy selecting those pods admits the port from them
//     only (../peers-check.mjs);
//  4. the stats tags: each Gateway's infrastructure.parametersRef names an EnvoyProxy here
//     (envoyproxy.schema.json, strict) whose bootstrap, type Merge, adds the top-level
//     envoy.yaml's stats_config.stats_tags and nothing else, merged by `envoy --mode validate`
//     over a stand-in of Envoy Gateway's stats_config (eg-bootstrap-stats.yaml).
//
// The stand-ins are not Envoy Gateway's full output, so this says the patches apply and give
// valid Envoy config, not that a live gateway behaves.
//
//   WARMROUTE_CHECK_CONFIG=BIN node check.mjs ENVOY_BIN DIR   (DIR: gateway.yaml, httproute.yaml,
//                                      envoypatchpolicy.yaml, envoyproxy.yaml, pluginconfig.json)
import { spawnSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { createRequire } from "node:module";
import { isDeepStrictEqual } from "node:util";
import { parseAllDocuments } from "yaml";
import { bodyLimit, ENVOY_DEFAULT_BUFFER, verdicts } from "../filter-verdict.mjs";
import { additionalPorts, noClientService, peerNetworkPolicies, peerServices } from "../peers-check.mjs";

const require = createRequire(path.join(path.dirname(new URL(import.meta.url).pathname), "..", "package.json"));
const [envoy, dir] = process.argv.slice(2);
const checker = process.env.WARMROUTE_CHECK_CONFIG;
if (!envoy || !dir || !checker) {
  console.error("usage: WARMROUTE_CHECK_CONFIG=BIN node check.mjs ENVOY_BIN DIR");
  process.exit(2);
}
let failed = 0;
const fail = (m) => { failed++; console.log(`FAIL ${m}`); };
const ok = (m) => console.log(`ok   ${m}`);
const { verdict, close } = verdicts(checker, ok, fail);
const isObject = (v) => v !== null && typeof v === "object" && !Array.isArray(v);

const all = fs.readdirSync(dir).filter((f) => f.endsWith(".yaml")).sort().flatMap((f) =>
  parseAllDocuments(fs.readFileSync(path.join(dir, f), "utf8"), { uniqueKeys: true })
    .map((d) => d.toJS()).filter(Boolean).map((o) => ({ f, o })));
const policies = all.filter(({ o }) => o.kind === "EnvoyPatchPolicy");
const gateways = all.filter(({ o }) => o.kind === "Gateway");
const routes = all.filter(({ o }) => o.kind === "HTTPRoute");
if (!policies.length) fail(`${dir}: no EnvoyPatchPolicy`);

// ---------------------------------------------------------------- 1. the API schema
const schemaFile = path.join(path.dirname(new URL(import.meta.url).pathname), "envoypatchpolicy.schema.json");
const strict = (s) => {
  if (Array.isArray(s)) return s.map(strict);
  if (!isObject(s)) return s;
  const out = Object.fromEntries(Object.entries(s).filter(([k]) => k !== "$comment").map(([k, v]) => [k, strict(v)]));
  if (out.properties && out.additionalProperties === undefined && !out["x-kubernetes-preserve-unknown-fields"]) out.additionalProperties = false;
  return out;
};
const schema = strict(JSON.parse(fs.readFileSync(schemaFile, "utf8")));
schema.properties.metadata = { type: "object", required: ["name", "namespace"], properties: { name: { type: "string" }, namespace: { type: "string" }, labels: { type: "object" }, annotations: { type: "object" } }, additionalProperties: false };
const Ajv = require("ajv").default;
const ajv = new Ajv({ strict: false, allErrors: true });
require("ajv-formats").default(ajv);
ajv.addFormat("int64", { type: "number", validate: Number.isInteger });
ajv.addFormat("int32", { type: "number", validate: (n) => Number.isInteger(n) && n >= -(2 ** 31) && n < 2 ** 31 });
const validate = ajv.compile(schema);
for (const { f, o } of policies) {
  const label = `${f} EnvoyPatchPolicy/${o.metadata?.name}`;
  if (o.apiVersion !== "gateway.envoyproxy.io/v1alpha1") fail(`${label}: apiVersion ${o.apiVersion}, not gateway.envoyproxy.io/v1alpha1`);
  else if (!validate(o)) {
    fail(`${label}: Envoy Gateway's EnvoyPatchPolicy API (v1alpha1)`);
    for (const e of validate.errors) console.log(`       ${e.instancePath || "/"} ${e.message}${e.params?.additionalProperty ? ` (${e.params.additionalProperty})` : ""}${e.params?.allowedValues ? ` ${JSON.stringify(e.params.allowedValues)}` : ""}`);
  } else ok(`${label} (Envoy Gateway EnvoyPatchPolicy API v1alpha1, strict)`);
}

// ---------------------------------------------------------------- 2. stand-ins + JSON patches
const LB = "type.googleapis.com/envoy.extensions.load_balancing_policies";
const HCM_TYPE = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager";
const WASM_TYPE = "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm";
const TYPES = {
  "type.googleapis.com/envoy.config.listener.v3.Listener": "listeners",
  "type.googleapis.com/envoy.config.route.v3.RouteConfiguration": "routes",
  "type.googleapis.com/envoy.config.cluster.v3.Cluster": "clusters",
};
const EG_ADMIN = { address: "127.0.0.1", port_value: 19000 };
const EG_BUFFER = 32768; // Envoy Gateway's per_connection_buffer_limit_bytes
// The labels Envoy Gateway puts on a Gateway's proxy pods (internal/infrastructure/kubernetes/proxy/
// resource.go EnvoyAppLabel, internal/gatewayapi/helpers.go GatewayOwnerLabels).
const proxyLabels = (gw) => ({
  "app.kubernetes.io/name": "envoy", "app.kubernetes.io/component": "proxy", "app.kubernetes.io/managed-by": "envoy-gateway",
  "gateway.envoyproxy.io/owning-gateway-name": gw.metadata.name, "gateway.envoyproxy.io/owning-gateway-namespace": gw.metadata.namespace,
});
// The port Envoy Gateway's proxy binds for a listener port (internal/gatewayapi/listener.go
// servicePortToContainerPort: privileged ports shifted by 10000).
const containerPort = (p) => (p < 1024 ? p + 10000 : p);

function standIns(gw) {
  const ns = gw.metadata.namespace;
  const xds = { listeners: [], routes: [], clusters: [] };
  for (const [i, l] of (gw.spec?.listeners ?? []).entries()) {
    const name = `${ns}/${gw.metadata.name}/${l.name}`;
    xds.listeners.push({
      name,
      address: { socket_address: { address: "0.0.0.0", port_value: containerPort(Number(l.port ?? 10080 + i)) } },
      per_connection_buffer_limit_bytes: EG_BUFFER,
      drain_type: "MODIFY_ONLY",
      default_filter_chain: { name, filters: [{ name: "envoy.filters.network.http_connection_manager", typed_config: {
        "@type": HCM_TYPE, stat_prefix: `http-${l.port}`, codec_type: "AUTO", use_remote_address: true, normalize_path: true,
        server_header_transformation: "PASS_THROUGH", common_http_protocol_options: { headers_with_underscores_action: "REJECT_REQUEST" },
        rds: { config_source: { ads: {}, resource_api_version: "V3" }, route_config_name: name },
        http_filters: [{ name: "envoy.filters.http.router", typed_config: { "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router", suppress_envoy_headers: true } }],
      } }] },
    });
    const vhosts = [];
    for (const { o: r } of routes) {
      const attached = (r.spec?.parentRefs ?? []).some((p) => (p.kind ?? "Gateway") === "Gateway" && p.name === gw.metadata.name
        && (p.namespace ?? r.metadata.namespace) === ns && (p.sectionName ?? l.name) === l.name);
      if (!attached) continue;
      for (const host of r.spec?.hostnames ?? [l.hostname ?? "*"]) {
        let vh = vhosts.find((v) => v.domains[0] === host);
        if (!vh) vhosts.push(vh = { name: `${name}/${host.replaceAll(".", "_")}`, domains: [host], routes: [] });
        for (const [ri, rule] of (r.spec?.rules ?? []).entries()) {
          const cluster = `httproute/${r.metadata.namespace}/${r.metadata.name}/rule/${ri}`;
          vh.routes.push({ name: `${cluster}/match/0/${host.replaceAll(".", "_")}`, match: { prefix: "/" }, route: { cluster, timeout: "0s" } });
          if (!xds.clusters.some((c) => c.name === cluster)) {
            xds.clusters.push({
              name: cluster, type: "EDS", connect_timeout: "10s", dns_lookup_family: "V4_PREFERRED", ignore_health_on_host_removal: true,
              per_connection_buffer_limit_bytes: EG_BUFFER, common_lb_config: {},
              circuit_breakers: { thresholds: [{ max_retries: 1024 }] },
              eds_cluster_config: { service_name: cluster, eds_config: { ads: {}, resource_api_version: "V3" } },
              load_balancing_policy: { policies: [{ typed_extension_config: { name: "envoy.load_balancing_policies.least_request",
                typed_config: { "@type": `${LB}.least_request.v3.LeastRequest`, locality_lb_config: { locality_weighted_lb_config: {} } } } }] },
            });
          }
        }
      }
    }
    xds.routes.push({ name, ignore_port_in_host_matching: true, virtual_hosts: vhosts });
  }
  return xds;
}

// RFC 6901 / 6902, strict as Envoy Gateway's library: the parent of the target must exist.
const unescape = (t) => t.replaceAll("~1", "/").replaceAll("~0", "~");
function applyOp(doc, op) {
  if (op.op === "move" || op.op === "copy") {
    // RFC 6902 4.4/4.5: read `from` (it must exist), for move remove it, then add the value.
    if (typeof op.from !== "string") throw new Error(`${op.op} ${op.path}: no from`);
    const value = applyOp(doc, { op: "test-read", path: op.from });
    if (op.op === "move") applyOp(doc, { op: "remove", path: op.from });
    return applyOp(doc, { op: "add", path: op.path, value });
  }
  if (!["add", "remove", "replace", "test", "test-read"].includes(op.op)) throw new Error(`${op.path}: op ${op.op} is not RFC 6902`);
  if (typeof op.path !== "string" || (op.path !== "" && !op.path.startsWith("/"))) throw new Error(`path ${op.path}: must be empty or start with /`);
  const tokens = op.path.split("/").slice(1).map(unescape);
  const last = tokens.pop();
  let parent = doc;
  for (const [i, t] of tokens.entries()) {
    const next = Array.isArray(parent) ? parent[Number(t)] : isObject(parent) && Object.hasOwn(parent, t) ? parent[t] : undefined;
    if (next === undefined || (Array.isArray(parent) && !/^(0|[1-9][0-9]*)$/.test(t))) throw new Error(`path ${op.path}: /${tokens.slice(0, i + 1).join("/")} does not exist`);
    parent = next;
  }
  if (Array.isArray(parent)) {
    const idx = last === "-" ? parent.length : Number(last);
    if (!(last === "-" || /^(0|[1-9][0-9]*)$/.test(last)) || idx > parent.length || (op.op !== "add" && idx >= parent.length)) throw new Error(`path ${op.path}: index ${last} out of range (${parent.length} elements)`);
    if (op.op === "add") parent.splice(idx, 0, structuredClone(op.value));
    else if (op.op === "replace") parent[idx] = structuredClone(op.value);
    else if (op.op === "remove") parent.splice(idx, 1);
    else if (op.op === "test" && !isDeepStrictEqual(parent[idx], op.value)) throw new Error(`test ${op.path} failed`);
    else if (op.op === "test-read") return structuredClone(parent[idx]);
  } else if (isObject(parent)) {
    if (op.op !== "add" && !Object.hasOwn(parent, last)) throw new Error(`path ${op.path}: ${last} does not exist`);
    if (op.op === "add" || op.op === "replace") parent[last] = structuredClone(op.value);
    else if (op.op === "remove") delete parent[last];
    else if (op.op === "test" && !isDeepStrictEqual(parent[last], op.value)) throw new Error(`test ${op.path} failed`);
    else if (op.op === "test-read") return structuredClone(parent[last]);
  } else throw new Error(`path ${op.path}: parent is not an object or array`);
}

const scratch = fs.mkdtempSync(path.join(os.tmpdir(), "warmroute-eg-"));
let ref;
try { ref = JSON.parse(fs.readFileSync(path.join(dir, "pluginconfig.json"), "utf8")); } catch (e) { fail(`${dir}/pluginconfig.json: ${e.message}`); }
for (const { f, o: pol } of policies) {
  const tr = pol.spec?.targetRef ?? {};
  const gw = gateways.find(({ o }) => tr.kind === "Gateway" && o.metadata?.name === tr.name && o.metadata?.namespace === pol.metadata?.namespace)?.o;
  const who = `${f} EnvoyPatchPolicy/${pol.metadata?.name}`;
  if (!gw) { fail(`${who}: targetRef ${JSON.stringify(tr)} is no Gateway here in namespace ${pol.metadata?.namespace} (the policy must be in the Gateway's namespace)`); continue; }
  const xds = standIns(gw);
  const applied = [];
  for (const [i, p] of [...(pol.spec?.jsonPatches ?? [])].entries()) {
    const where = `${who} jsonPatches[${i}] ${p.operation?.op} ${p.name}${p.operation?.path ?? ""}`;
    const kind = TYPES[p.type];
    if (!kind) { fail(`${where}: type ${p.type} has no stand-in here`); continue; }
    if (p.operation?.jsonPath) { fail(`${where}: jsonPath is not applied by this check; use path`); continue; }
    const op = { op: p.operation?.op, path: p.operation?.path ?? "", from: p.operation?.from, value: p.operation?.value };
    if (op.op === "add" && op.path === "") {
      if (op.value?.name !== p.name) { fail(`${where}: adds a resource named ${op.value?.name}, not ${p.name}`); continue; }
      if (xds[kind].some((r) => r.name === p.name)) { fail(`${where}: ${p.name} already exists`); continue; }
      xds[kind].push(structuredClone(op.value));
    } else {
      const target = xds[kind].find((r) => r.name === p.name);
      if (!target) { fail(`${where}: Envoy Gateway generates no ${kind.slice(0, -1)} named ${p.name} for Gateway ${gw.metadata.namespace}/${gw.metadata.name} (ResourceNotFound)`); continue; }
      try { applyOp(target, op); } catch (e) { fail(`${where}: ${e.message}`); continue; }
    }
    applied.push(`${p.operation.op} ${p.name}${op.path}`);
  }

  // The patched xDS as one static bootstrap: each route configuration inlined where RDS names it.
  const listeners = structuredClone(xds.listeners);
  for (const l of listeners) {
    const hcm = l.default_filter_chain?.filters?.find((x) => x.typed_config?.["@type"] === HCM_TYPE)?.typed_config;
    if (hcm?.rds) { hcm.route_config = structuredClone(xds.routes.find((r) => r.name === hcm.rds.route_config_name)); delete hcm.rds; }
  }
  const bootstrap = {
    node: { id: "warmroute-check", cluster: "warmroute-check" },
    admin: { address: { socket_address: EG_ADMIN } },
    dynamic_resources: { ads_config: { api_type: "DELTA_GRPC", transport_api_version: "V3", grpc_services: [{ envoy_grpc: { cluster_name: "xds_cluster" } }] } },
    static_resources: {
      listeners,
      clusters: [
        { name: "prometheus_stats", type: "STATIC", connect_timeout: "0.250s", load_assignment: { cluster_name: "prometheus_stats", endpoints: [{ lb_endpoints: [{ endpoint: { address: { socket_address: EG_ADMIN } } }] }] } },
        { name: "xds_cluster", type: "STATIC", connect_timeout: "10s",
          typed_extension_protocol_options: { "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": { "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions", explicit_http_config: { http2_protocol_options: {} } } },
          load_assignment: { cluster_name: "xds_cluster", endpoints: [{ lb_endpoints: [{ endpoint: { address: { socket_address: { address: "127.0.0.1", port_value: 18000 } } } }] }] } },
        ...xds.clusters,
      ],
    },
  };
  const file = path.join(scratch, `${pol.metadata?.name}.json`);
  fs.writeFileSync(file, JSON.stringify(bootstrap, null, 2));
  const r = spawnSync(envoy, ["--mode", "validate", "-c", file, "-l", "critical", "--log-format", "%v"], { encoding: "utf8" });
  if (r.status === 0) ok(`envoy --mode validate: ${who} on Envoy Gateway's xDS for ${gw.metadata.namespace}/${gw.metadata.name}: ${applied.join("; ")}`);
  else {
    fail(`envoy --mode validate: ${who}`);
    console.log(`       ${`${r.stderr}${r.stdout}${r.error ?? ""}`.trim().split("\n")[0].replace(file, "stand-in").replace(/\s+/g, " ").slice(0, 400)}`);
  }

  // ---------------------------------------------------------------- 3. the filter as patched in
  const clusters = new Map(xds.clusters.map((c) => [c.name, c]));
  const ruleClusters = new Set(xds.routes.flatMap((rc) => rc.virtual_hosts.flatMap((vh) => vh.routes.map((x) => x.route?.cluster))));
  for (const l of xds.listeners) {
    const hcm = l.default_filter_chain?.filters?.find((x) => x.typed_config?.["@type"] === HCM_TYPE)?.typed_config ?? {};
    const wasm = (hcm.http_filters ?? []).filter((h) => h.typed_config?.["@type"] === WASM_TYPE);
    if (wasm.length !== 1) { fail(`${who}: listener ${l.name}: ${wasm.length} Wasm filters, want the one warmroute filter`); continue; }
    const cfg = wasm[0].typed_config.config ?? {};
    const at = `${who}: listener ${l.name}`;
    if (cfg.allow_on_headers_stop_iteration !== true) fail(`${at}: allow_on_headers_stop_iteration is ${cfg.allow_on_headers_stop_iteration}, not true: Envoy never hands the body to the filter that paused on the headers`);
    else ok(`${at}: Wasm filter with allow_on_headers_stop_iteration: true`);
    if ((hcm.http_filters ?? []).at(-1)?.name !== "envoy.filters.http.router") fail(`${at}: the router is not the last HTTP filter`);
    const remote = cfg.vm_config?.code?.remote;
    if (!remote) fail(`${at}: the module is not fetched by code.remote (nothing else reaches the gateway's pods without an EnvoyProxy volume)`);
    else {
      if (!/^[0-9a-f]{64}$/.test(String(remote.sha256 ?? ""))) fail(`${at}: code.remote.sha256 ${remote.sha256} is not a sha256: any file at the URL would run`);
      if (!clusters.has(remote.http_uri?.cluster)) fail(`${at}: code.remote.http_uri.cluster ${remote.http_uri?.cluster} is no cluster of the gateway`);
      else ok(`${at}: module ${remote.http_uri.uri} pinned to sha256 ${String(remote.sha256).slice(0, 12)}..., fetched through ${remote.http_uri.cluster}`);
    }
    let conf;
    try { conf = JSON.parse(cfg.configuration?.value ?? ""); } catch (e) { fail(`${at}: configuration is not JSON: ${e.message}`); continue; }
    if (!isDeepStrictEqual(conf, ref)) fail(`${at}: configuration differs from pluginconfig.json`);
    // The buffers it runs under: the least body limit of any route, and the listener's.
    const rc = xds.routes.find((x) => x.name === hcm.rds?.route_config_name);
    const listenerLimit = Number(l.per_connection_buffer_limit_bytes ?? ENVOY_DEFAULT_BUFFER);
    verdict(cfg.configuration.value, `${at} configuration`, [bodyLimit(rc?.virtual_hosts ?? [], listenerLimit), listenerLimit]);
    // pool.cluster: an HTTPRoute rule's cluster on this listener, with override_host.
    const overrideHost = (c) => c?.load_balancing_policy?.policies?.[0]?.typed_extension_config?.typed_config;
    const pool = conf.pool?.cluster;
    const oh = overrideHost(clusters.get(pool));
    if (!ruleClusters.has(pool)) fail(`${at}: pool.cluster ${pool} is no HTTPRoute rule's cluster on this gateway (${[...ruleClusters].join(", ")})`);
    else if (oh?.["@type"] !== `${LB}.override_host.v3.OverrideHost` || !oh.override_host_sources?.some((s) => s.header === conf.route?.header))
      fail(`${at}: pool.cluster ${pool} has no override_host policy reading ${conf.route?.header}: requests go where Envoy Gateway's own policy sends them`);
    else ok(`${at}: pool.cluster ${pool} routes by ${conf.route.header} (override_host)`);
    const mc = clusters.get(conf.metrics?.cluster);
    const mfb = overrideHost(mc)?.fallback_policy?.policies?.[0]?.typed_extension_config?.typed_config;
    if (!mc) fail(`${at}: metrics.cluster ${conf.metrics?.cluster} is no cluster of the gateway`);
    else if (mc.name === pool || ruleClusters.has(mc.name)) fail(`${at}: metrics.cluster ${mc.name} is a routing cluster, whose fallback answers a scrape from another pod`);
    else if (mc.type !== "EDS" || mc.eds_cluster_config?.service_name !== pool) fail(`${at}: metrics.cluster ${mc.name}: not EDS of ${pool}'s endpoints`);
    else if (mfb?.fallback_policy !== "NO_FALLBACK") fail(`${at}: metrics.cluster ${mc.name}: override_host fallback is not a subset policy with NO_FALLBACK: a stale address is answered by another pod`);
    else ok(`${at}: metrics.cluster ${mc.name}: ${pool}'s endpoints, no fallback host`);
    const ac = clusters.get(conf.pool?.admin_cluster);
    const aeps = (ac?.load_assignment?.endpoints ?? []).flatMap((e) => e.lb_endpoints ?? []).map((e) => e.endpoint?.address?.socket_address);
    if (!ac || ac.type !== "STATIC" || aeps.length !== 1 || aeps[0].address !== EG_ADMIN.address || Number(aeps[0].port_value) !== EG_ADMIN.port_value)
      fail(`${at}: pool.admin_cluster ${conf.pool?.admin_cluster}: not a STATIC cluster of the proxy's admin ${EG_ADMIN.address}:${EG_ADMIN.port_value} (${JSON.stringify(aeps)})`);
    else ok(`${at}: pool.admin_cluster ${ac.name} is the proxy's admin`);
    for (const vh of rc?.virtual_hosts ?? []) for (const rt of vh.routes ?? []) {
      if (rt.route?.cluster === ac?.name || rt.route?.cluster_header) fail(`${at}: route ${rt.name} reaches the admin (or lets the client name a cluster)`);
    }
    // The exchange between the gateway's replicas.
    if (conf.peers) {
      const port = Number(conf.peers.port);
      const clientPorts = (gw.spec?.listeners ?? []).flatMap((x) => [Number(x.port), containerPort(Number(x.port))]);
      const added = additionalPorts(l);
      if (!added.includes(port)) fail(`${at}: peers.port ${port} is no address of this listener (additional_addresses ${JSON.stringify(added)}): the filter answers peers only on it`);
      else if (clientPorts.includes(port)) fail(`${at}: peers.port ${port} is a port of the Gateway's listeners, on the Service in front of clients`);
      else ok(`${at}: the peer port ${port} is an address of this listener, on no port of the Gateway's`);
      const pc = clusters.get(conf.peers.cluster);
      const pfb = overrideHost(pc)?.fallback_policy?.policies?.[0]?.typed_extension_config?.typed_config;
      const eps = (pc?.load_assignment?.endpoints ?? []).flatMap((e) => e.lb_endpoints ?? []).map((e) => e.endpoint?.address?.socket_address).filter(Boolean);
      const why = !pc ? "is no cluster of the gateway"
        : ruleClusters.has(pc.name) ? "is a routing cluster"
        : overrideHost(pc)?.["@type"] !== `${LB}.override_host.v3.OverrideHost` || !overrideHost(pc).override_host_sources?.some((x) => x.header === "x-gateway-destination-endpoint")
          ? "has no override_host policy reading x-gateway-destination-endpoint: a pull would reach whichever replica"
        : pfb?.fallback_policy !== "NO_FALLBACK" || pfb?.panic_mode_any === true ? "override_host fallback is not a subset policy with NO_FALLBACK: a pull of a gone replica would be answered by another"
        : pc.transport_socket || pc.transport_socket_matches ? "a transport socket: the peer port is the gateway's own listener, in plain text"
        : pc.type === "EDS" ? "type EDS: Envoy Gateway serves EDS only for the clusters it generates"
        : pc.type !== "STRICT_DNS" ? `type ${pc.type ?? "STATIC"}, not STRICT_DNS of the replicas' headless Service (one endpoint per ready replica)`
        : eps.length !== 1 || Number(eps[0].port_value) !== port ? `endpoints ${JSON.stringify(eps)}: not one DNS name on peers.port ${port}`
        : undefined;
      if (why) fail(`${at}: peers.cluster ${conf.peers.cluster} ${why}`);
      else {
        ok(`${at}: peers.cluster ${pc.name}: ${eps[0].address}:${port} by DNS, a pull reaches the replica named or fails`);
        const host = String(eps[0].address);
        const ns = host.split(".")[1];
        const [oks, fails] = peerServices(all, { namespace: ns, podLabels: proxyLabels(gw), port, host, who: at });
        oks.forEach(ok); fails.forEach(fail);
        for (const check of [noClientService, peerNetworkPolicies]) {
          const [o2, f2] = check(all, { namespace: ns, podLabels: proxyLabels(gw), port, who: at });
          o2.forEach(ok); f2.forEach(fail);
        }
      }
      const pac = clusters.get(conf.peers.admin_cluster ?? "envoy-admin");
      const paeps = (pac?.load_assignment?.endpoints ?? []).flatMap((e) => e.lb_endpoints ?? []).map((e) => e.endpoint?.address?.socket_address);
      if (!pac || pac.type !== "STATIC" || paeps.length !== 1 || paeps[0].address !== EG_ADMIN.address || Number(paeps[0].port_value) !== EG_ADMIN.port_value)
        fail(`${at}: peers.admin_cluster ${conf.peers.admin_cluster ?? "envoy-admin"}: not a STATIC cluster of the proxy's admin ${EG_ADMIN.address}:${EG_ADMIN.port_value}`);
      for (const vh of rc?.virtual_hosts ?? []) for (const rt of vh.routes ?? []) {
        if (rt.route?.cluster === conf.peers.cluster) fail(`${at}: route ${rt.name} reaches the peers cluster: clients would read the replicas' events`);
      }
    }
    const removed = new Set((hcm.early_header_mutation_extensions ?? []).flatMap((e) => e.typed_config?.mutations ?? []).map((m) => m.remove).filter(Boolean));
    // The routing headers, the published model (if set), the gate's class and deadline
    // (istio/generate.py, stripped_headers): only warmroute or a stage before it sets them.
    const trusted = ["x-gateway-destination-endpoint", "x-warmroute-backend", conf.route?.model_header,
      conf.gate?.header ?? "x-warmroute-priority", "x-gateway-inference-objective",
      conf.gate?.deadline_header ?? "x-warmroute-deadline-ms"].filter(Boolean).map((h) => h.toLowerCase());
    const missing = trusted.filter((h) => !removed.has(h));
    if (missing.length) fail(`${at}: clients' ${missing.join(", ")} not stripped before the route is picked`);
    else ok(`${at}: clients' routing, class and deadline headers stripped (early header mutation)`);
  }
}

// ---------------------------------------------------------------- 4. the stats tags
// Each Gateway's EnvoyProxy (infrastructure.parametersRef) merges the filter's stats tags, the
// same as the top-level envoy.yaml's and nothing else, over Envoy Gateway's bootstrap
// (mergeBootstrap: proto.Merge, which Envoy's --config-yaml does too), checked through
// `envoy --mode validate` over a stand-in of that bootstrap's stats_config.
const here = path.dirname(new URL(import.meta.url).pathname);
const refTags = parseAllDocuments(fs.readFileSync(path.join(here, "..", "..", "envoy.yaml"), "utf8"))[0].toJS()?.stats_config?.stats_tags;
const proxySchema = strict(JSON.parse(fs.readFileSync(path.join(here, "envoyproxy.schema.json"), "utf8")));
proxySchema.properties.metadata = schema.properties.metadata;
const validateProxy = ajv.compile(proxySchema);
const proxies = all.filter(({ o }) => o.kind === "EnvoyProxy");
for (const { f, o } of proxies) {
  const label = `${f} EnvoyProxy/${o.metadata?.name}`;
  if (!validateProxy(o)) {
    fail(`${label}: Envoy Gateway's EnvoyProxy API (v1alpha1)`);
    for (const e of validateProxy.errors) console.log(`       ${e.instancePath || "/"} ${e.message}${e.params?.additionalProperty ? ` (${e.params.additionalProperty})` : ""}${e.params?.allowedValues ? ` ${JSON.stringify(e.params.allowedValues)}` : ""}`);
  } else ok(`${label} (Envoy Gateway EnvoyProxy API v1alpha1, bootstrap, strict)`);
}
for (const { f, o: gw } of gateways) {
  const ns = gw.metadata?.namespace;
  const who = `${f} Gateway ${ns}/${gw.metadata?.name}`;
  const pr = gw.spec?.infrastructure?.parametersRef;
  if (pr?.group !== "gateway.envoyproxy.io" || pr?.kind !== "EnvoyProxy") { fail(`${who}: no infrastructure.parametersRef to an EnvoyProxy: its proxies' stats stay unlabelled`); continue; }
  const ep = proxies.find(({ o }) => o.metadata?.name === pr.name && o.metadata?.namespace === ns);
  if (!ep) { fail(`${who}: parametersRef EnvoyProxy ${ns}/${pr.name} is not here (Envoy Gateway reads it from the Gateway's namespace)`); continue; }
  const at = `${ep.f} EnvoyProxy/${pr.name}`;
  const bs = ep.o.spec?.bootstrap ?? {};
  // Unset, the type is Replace: the value would be the whole bootstrap, without Envoy Gateway's xDS.
  if (bs.type !== "Merge") { fail(`${at}: bootstrap.type ${bs.type ?? "unset (Replace)"}, not Merge: it would replace Envoy Gateway's bootstrap`); continue; }
  let value;
  try { value = parseAllDocuments(bs.value ?? "")[0]?.toJS(); } catch (e) { fail(`${at}: bootstrap.value is not YAML: ${e.message}`); continue; }
  const others = [...Object.keys(value ?? {}).filter((k) => k !== "stats_config"), ...Object.keys(value?.stats_config ?? {}).filter((k) => k !== "stats_tags").map((k) => `stats_config.${k}`)];
  if (others.length) fail(`${at}: bootstrap.value also sets ${others.join(", ")}: it may set stats_config.stats_tags only`);
  else if (!isDeepStrictEqual(value?.stats_config?.stats_tags, refTags)) fail(`${at}: stats_tags differ from envoy.yaml's`);
  else ok(`${at}: the stats_tags of envoy.yaml (${refTags.map((t) => t.tag_name).join(", ")}), merged into Envoy Gateway's bootstrap`);
  const r = spawnSync(envoy, ["--mode", "validate", "-c", path.join(here, "eg-bootstrap-stats.yaml"), "--config-yaml", JSON.stringify(value ?? {}),
    "-l", "critical", "--log-format", "%v"], { encoding: "utf8" });
  if (r.status === 0) ok(`${at}: merged over Envoy Gateway's stats_config by Envoy (--mode validate)`);
  else fail(`${at}: Envoy refuses it merged over Envoy Gateway's bootstrap: ${(r.stderr || r.stdout || `${r.error}`).trim().split("\n").pop()}`);
}
fs.rmSync(scratch, { recursive: true, force: true });
close();
process.exit(failed ? 1 : 0);
