// The Envoy side of warmroute's EnvoyFilters, checked by Envoy itself.
//
// Istio's schema leaves an EnvoyFilter's patch values free-form, so a misspelled field or enum in
// an added cluster or a merged policy passes it and is only refused by the proxy, after istiod
// has pushed it. Here each workload's patches are applied, as istiod would, to stand-ins of the
// objects Istio generates for that workload (its outbound cluster for the vLLM Service, an HTTP
// listener with the HTTP connection manager, a virtual host and the router; the bootstrap's
// xds-grpc and sds-grpc clusters; the listener on the port a LISTENER patch matches, the gateway's),
// and the result goes
// to `envoy --mode validate`: every field, enum and extension name must be one this Envoy knows.
// The stand-ins are not Istio's full output, so this says the patches are valid Envoy config,
// not that a live mesh behaves.
//
// Not covered: EXTENSION_CONFIG (the Wasm filter's own config, which istio-agent rewrites before
// Envoy sees it; its fields are those of envoy.yaml, which `make validate-envoy` runs, and its
// configuration is checked by warmroute-check-config).
//
//   node check-envoyfilter-patches.mjs ENVOY_BIN FILE.yaml...
import { spawnSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { parseAllDocuments } from "yaml";

const [envoy, ...files] = process.argv.slice(2);
if (!envoy || !files.length) {
  console.error("usage: node check-envoyfilter-patches.mjs ENVOY_BIN FILE.yaml...");
  process.exit(2);
}
let failed = 0;
const fail = (m) => { failed++; console.log(`FAIL ${m}`); };

const isObject = (v) => v !== null && typeof v === "object" && !Array.isArray(v);
// proto.Merge as istiod applies a MERGE patch: messages merge field by field, repeated fields
// append, scalars replace. An Any merges into an Any of the same type.
function merge(dst, src) {
  for (const [k, v] of Object.entries(src)) {
    if (isObject(v) && isObject(dst[k]) && (v["@type"] ?? dst[k]["@type"]) === (dst[k]["@type"] ?? v["@type"])) merge(dst[k], v);
    else if (Array.isArray(v) && Array.isArray(dst[k])) dst[k].push(...structuredClone(v));
    else dst[k] = structuredClone(v);
  }
  return dst;
}

const LB = "type.googleapis.com/envoy.extensions.load_balancing_policies";
const ads = { ads: {}, resource_api_version: "V3" };
// The parts of Istio's output the patches touch, for one workload whose vLLM Service is
// host:port (the one its CLUSTER MERGE patches name).
function standIns(host, port, listenerPort) {
  const vllm = {
    // Named and fed as Istio's outbound cluster for the vLLM Service is.
    name: `outbound|${port}||${host}`,
    type: "EDS",
    connect_timeout: "10s",
    lb_policy: "LEAST_REQUEST",
    eds_cluster_config: { service_name: `outbound|${port}||${host}`, eds_config: ads },
  };
  const vhost = { name: `${host}:${port}`, domains: ["*"], routes: [{ match: { prefix: "/" }, route: { cluster: vllm.name, timeout: "0s" } }] };
  const hcm = {
    name: "envoy.filters.network.http_connection_manager",
    typed_config: {
      "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
      stat_prefix: "outbound_0.0.0.0_8000",
      route_config: { name: "8000", virtual_hosts: [vhost] },
      http_filters: [{ name: "envoy.filters.http.router", typed_config: { "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router" } }],
    },
  };
  const listener = {
    name: `0.0.0.0_${listenerPort}`,
    address: { socket_address: { address: "0.0.0.0", port_value: listenerPort } },
    filter_chains: [{ filters: [hcm] }],
  };
  const bootstrap = {
    node: { id: "warmroute-check", cluster: "warmroute-check" },
    // istiod serves CDS/EDS/ECDS over ADS; the stand-ins ask it the same way.
    dynamic_resources: { ads_config: { api_type: "GRPC", transport_api_version: "V3", grpc_services: [{ envoy_grpc: { cluster_name: "xds-grpc" } }] } },
    static_resources: {
      listeners: [listener],
      clusters: [
        {
          name: "xds-grpc",
          type: "STATIC",
          typed_extension_protocol_options: {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
              "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
              explicit_http_config: { http2_protocol_options: {} },
            },
          },
          load_assignment: { cluster_name: "xds-grpc", endpoints: [{ lb_endpoints: [{ endpoint: { address: { socket_address: { address: "127.0.0.1", port_value: 15010 } } } }] }] },
        },
        {
          // istio-agent's SDS server, as Istio's bootstrap declares it: the scrape cluster's
          // Istio mTLS asks it for the secrets `default` (the proxy's certificate) and `ROOTCA`.
          name: "sds-grpc",
          type: "STATIC",
          connect_timeout: "1s",
          typed_extension_protocol_options: {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
              "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
              explicit_http_config: { http2_protocol_options: {} },
            },
          },
          load_assignment: { cluster_name: "sds-grpc", endpoints: [{ lb_endpoints: [{ endpoint: { address: { pipe: { path: "./var/run/secrets/workload-spiffe-uds/socket" } } } }] }] },
        },
        vllm,
      ],
    },
  };
  return { bootstrap, vllm, vhost, hcm, listener };
}

// EnvoyFilters by the workload they select (namespace + selector labels).
const workloads = new Map();
for (const f of files) {
  for (const d of parseAllDocuments(fs.readFileSync(f, "utf8"))) {
    const o = d.toJS();
    if (o?.kind !== "EnvoyFilter") continue;
    const key = `${o.metadata?.namespace} ${JSON.stringify(Object.fromEntries(Object.entries(o.spec?.workloadSelector?.labels ?? {}).sort()))}`;
    if (!workloads.has(key)) workloads.set(key, []);
    workloads.get(key).push({ f: path.basename(f), o });
  }
}

const scratch = fs.mkdtempSync(path.join(os.tmpdir(), "warmroute-envoyfilter-"));
let seq = 0;
for (const [key, filters] of workloads) {
  const merged = filters.flatMap(({ o }) => o.spec?.configPatches ?? [])
    .find((p) => p.applyTo === "CLUSTER" && p.patch?.operation === "MERGE")?.match?.cluster ?? {};
  const host = merged.service ?? "vllm.llm.svc.cluster.local";
  const port = Number(merged.portNumber ?? 8000);
  // The listener a LISTENER patch matches by port (the gateway's, for the peer port): one stand-in
  // listener, so every such patch must match the same one.
  const listenerPorts = [...new Set(filters.flatMap(({ o }) => o.spec?.configPatches ?? [])
    .filter((p) => p.applyTo === "LISTENER" && p.match?.listener?.portNumber).map((p) => Number(p.match.listener.portNumber)))];
  if (listenerPorts.length > 1) fail(`${key}: LISTENER patches match ports ${listenerPorts.join(", ")}; the stand-in has one listener`);
  const s = standIns(host, port, listenerPorts[0] ?? 8000);
  const applied = [];
  for (const { f, o } of filters) {
    for (const [i, p] of (o.spec?.configPatches ?? []).entries()) {
      const where = `${f} ${o.metadata?.name} configPatches[${i}] ${p.applyTo} ${p.patch?.operation}`;
      const value = structuredClone(p.patch?.value ?? {});
      const op = `${p.applyTo} ${p.patch?.operation}`;
      if (op === "CLUSTER ADD") s.bootstrap.static_resources.clusters.push(value);
      else if (op === "CLUSTER MERGE") {
        const c = p.match?.cluster ?? {};
        const hits = (c.service ?? host) === host && [undefined, port].includes(c.portNumber) && !c.subset && !c.name;
        if (!hits) { fail(`${where}: matches ${JSON.stringify(c)}, which has no stand-in here`); continue; }
        merge(s.vllm, value);
      } else if (op === "NETWORK_FILTER MERGE") merge(s.hcm, value);
      else if (op === "VIRTUAL_HOST MERGE") merge(s.vhost, value);
      else if (op === "LISTENER MERGE") merge(s.listener, value);
      else if (op === "HTTP_FILTER INSERT_BEFORE") {
        const filters = s.hcm.typed_config.http_filters;
        filters.splice(filters.length - 1, 0, value);
      } else if (op === "EXTENSION_CONFIG ADD") continue;
      else { fail(`${where}: no stand-in for ${op}; teach deploy/istio/check-envoyfilter-patches.mjs`); continue; }
      applied.push(`${p.applyTo} ${p.patch.operation}${p.patch.value?.name ? ` ${p.patch.value.name}` : ""}`);
    }
  }
  // `envoy --mode validate` does not resolve the cluster an SDS/xDS gRPC source names (an
  // Envoy would only find it missing when it subscribes): every such name must be a cluster of
  // the stand-ins (Istio's bootstrap has xds-grpc and sds-grpc) or one the patches add.
  const clusters = new Set(s.bootstrap.static_resources.clusters.map((c) => c.name));
  const grpcRefs = [];
  const refs = (v) => {
    if (Array.isArray(v)) return v.forEach(refs);
    if (!isObject(v)) return;
    if (isObject(v.envoy_grpc) && v.envoy_grpc.cluster_name !== undefined) grpcRefs.push(v.envoy_grpc.cluster_name);
    Object.values(v).forEach(refs);
  };
  refs(s.bootstrap);
  for (const name of new Set(grpcRefs)) {
    if (!clusters.has(name)) fail(`${filters.map(({ f }) => f).join(", ")} (${key}): a gRPC source names cluster ${name}, which neither Istio's bootstrap nor the patches have`);
  }
  const file = path.join(scratch, `${seq++}.json`);
  fs.writeFileSync(file, JSON.stringify(s.bootstrap, null, 2));
  const r = spawnSync(envoy, ["--mode", "validate", "-c", file, "-l", "critical", "--log-format", "%v"], { encoding: "utf8" });
  const who = `${filters.map(({ f }) => f).join(", ")} (${key})`;
  if (r.status === 0) console.log(`ok   envoy --mode validate: ${who}: ${applied.join("; ")}`);
  else {
    // Envoy's first line names the field; the rest echoes the whole stand-in. Protobuf pads its
    // parse errors with random spaces (so nobody parses them); one space reads the same.
    const why = `${r.stderr}${r.stdout}${r.error ?? ""}`.trim().split("\n")[0].replace(file, "stand-in").replace(/\s+/g, " ");
    fail(`envoy --mode validate: ${who}`);
    console.log(`       ${why.slice(0, 400)}`);
  }
}
fs.rmSync(scratch, { recursive: true, force: true });
if (!workloads.size) fail("no EnvoyFilter found");
process.exit(failed ? 1 : 0);
