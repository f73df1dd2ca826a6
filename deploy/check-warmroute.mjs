// Cross-checks between warmroute's Istio manifests that no schema can express:
//  - every WasmPlugin's spec.pluginConfig and every generated EnvoyFilter's embedded JSON
//    equals istio/generated/pluginconfig.json (no hand-copied drift);
//  - the filter itself accepts each plugin config: every copy is handed, as Envoy would hand
//    it, to warmroute-check-config (the core's Config::parse, the same code on_configure
//    runs), never to a schema copied by hand; --shipped also refuses the debug header;
//  - so is every Wasm filter `configuration` of the standalone Envoy configs named after
//    ISTIO_DIR (envoy.yaml, envoy/*.yaml);
//  - max_body_bytes fits the Envoy buffers it runs under (--buffer-limits): in the standalone
//    configs the listener's and each virtual host's/route's limits, in a generated EnvoyFilter
//    its VIRTUAL_HOST/LISTENER patches over Envoy's 1 MiB default (Istio sets no listener limit);
//  - header mode: each backend name has a DestinationRule subset and a VirtualService header
//    match routing to it (a missing one is a 503 "no healthy upstream" in production).
//
//   WARMROUTE_CHECK_CONFIG=path/to/warmroute-check-config node check-warmroute.mjs ISTIO_DIR [ENVOY_YAML...]
import { spawnSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { isDeepStrictEqual } from "node:util";
import { parseAllDocuments } from "yaml";

const [dir, ...envoyConfigs] = process.argv.slice(2);
const checker = process.env.WARMROUTE_CHECK_CONFIG;
if (!dir || !checker) {
  console.error("usage: WARMROUTE_CHECK_CONFIG=BIN node check-warmroute.mjs ISTIO_DIR [ENVOY_YAML...]");
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

// ---- the filter's own verdict: each config as Envoy hands it over (JSON text)
const scratch = fs.mkdtempSync(path.join(os.tmpdir(), "warmroute-config-"));
let seq = 0;
// buffers: [body, listener] limits in bytes, or undefined where the config carries none.
function contract(config, where, buffers) {
  const file = path.join(scratch, `${seq++}.json`);
  fs.writeFileSync(file, typeof config === "string" ? config : JSON.stringify(config));
  const limits = buffers ? ["--buffer-limits", buffers.join(",")] : [];
  const r = spawnSync(checker, ["--shipped", ...limits, file], { encoding: "utf8" });
  const line = (r.stdout || r.stderr || `${r.error ?? "no output"}`).trim().replace(file, where);
  if (r.status === 0) ok(line.replace(/^ok +/, ""));
  else fail(line.replace(/^FAIL +/, ""));
}
contract(ref, "generated/pluginconfig.json");

// Envoy's per_connection_buffer_limit_bytes when a listener sets none.
const ENVOY_DEFAULT_BUFFER = 1048576;
// The least any route of an HTTP connection manager may buffer per request: a route's
// request_body_buffer_limit, else its virtual host's, else the listener's limit.
function bodyLimit(vhosts, listener) {
  let least = Infinity;
  for (const vh of vhosts) {
    for (const r of vh.routes?.length ? vh.routes : [{}]) {
      least = Math.min(least, Number(r.request_body_buffer_limit ?? vh.request_body_buffer_limit ?? listener));
    }
  }
  return least;
}

// ---- every embedded copy equals the generated one
for (const { f, o } of all) {
  const rel = path.relative(dir, f);
  if (o.kind === "WasmPlugin") {
    if (isDeepStrictEqual(o.spec?.pluginConfig, ref)) ok(`${rel}: pluginConfig == generated/pluginconfig.json`);
    else fail(`${rel}: spec.pluginConfig differs from generated/pluginconfig.json (re-run generate.py and copy it)`);
    contract(o.spec?.pluginConfig ?? {}, `${rel} pluginConfig`);
  }
  if (o.kind === "EnvoyFilter") {
    for (const p of o.spec?.configPatches ?? []) {
      const cfg = p.patch?.value?.typed_config?.config;
      if (p.applyTo !== "EXTENSION_CONFIG" || !cfg) continue;
      const patches = o.spec.configPatches ?? [];
      const listener = Number(patches.find((q) => q.applyTo === "LISTENER")?.patch?.value?.per_connection_buffer_limit_bytes
        ?? ENVOY_DEFAULT_BUFFER);
      const vhosts = patches.filter((q) => q.applyTo === "VIRTUAL_HOST").map((q) => q.patch?.value ?? {});
      contract(cfg.configuration?.value ?? "", `${rel} configuration`, [bodyLimit(vhosts.length ? vhosts : [{}], listener), listener]);
      let embedded;
      try { embedded = JSON.parse(cfg.configuration?.value ?? "null"); } catch (e) { fail(`${rel}: configuration.value is not JSON: ${e.message}`); continue; }
      if (isDeepStrictEqual(embedded, ref)) ok(`${rel}: embedded configuration == generated/pluginconfig.json`);
      else fail(`${rel}: embedded configuration differs from generated/pluginconfig.json`);
      if (cfg.allow_on_headers_stop_iteration !== true) fail(`${rel}: allow_on_headers_stop_iteration must be true`);
      else ok(`${rel}: allow_on_headers_stop_iteration: true`);
      const digest = cfg.vm_config?.code?.remote?.sha256;
      if (cfg.vm_config?.code?.remote && !/^[0-9a-f]{64}$/.test(digest ?? "")) {
        fail(`${rel}: the remote module has no sha256 digest (${digest}): a moved tag would swap the code`);
      } else ok(`${rel}: module pinned by sha256`);
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

// ---- header mode: backend <-> subset <-> route
if ((ref.route?.mode ?? "endpoint") === "header") {
  const header = ref.route.header ?? "x-warmroute-backend";
  const dr = all.find(({ o }) => o.kind === "DestinationRule")?.o;
  const vs = all.find(({ o }) => o.kind === "VirtualService")?.o;
  if (!dr || !vs) fail("header mode needs a DestinationRule and a VirtualService under generated/");
  else {
    const subsets = new Set((dr.spec.subsets ?? []).map((s) => s.name));
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
      else if (!d) fail(`backend ${b.name}: no VirtualService route matching ${header}: exact ${b.name}`);
      else if (d.subset !== b.name || d.host !== dr.spec.host) fail(`backend ${b.name}: route goes to ${d.host}/${d.subset}`);
      else ok(`backend ${b.name}: ${header} -> ${d.host} subset ${d.subset}`);
    }
    if (!(vs.spec.http ?? []).some((r) => !r.match)) fail("VirtualService has no default (match-less) route for fail-open traffic");
    const m = /^outbound\|(\d+)\|\|(.+)$/.exec(ref.metrics?.cluster ?? "");
    if (!m || m[2] !== dr.spec.host) fail(`metrics.cluster ${ref.metrics?.cluster} is not Istio's cluster for ${dr.spec.host}`);
    else ok(`metrics.cluster ${ref.metrics.cluster} is the vLLM Service's outbound cluster`);
  }
}
// ---- standalone Envoy configs: every warmroute Wasm filter's configuration
for (const f of envoyConfigs) {
  let found = 0;
  // ctx: the enclosing listener's buffer limit and, inside an HTTP connection manager with an
  // inline route_config, the least body buffer of its routes.
  const visit = (v, ctx) => {
    if (Array.isArray(v)) return v.forEach((x) => visit(x, ctx));
    if (!v || typeof v !== "object") return;
    if (v.filter_chains) ctx = { listener: Number(v.per_connection_buffer_limit_bytes ?? ENVOY_DEFAULT_BUFFER) };
    if (String(v["@type"] ?? "").endsWith(".HttpConnectionManager") && ctx) {
      ctx = { ...ctx, body: v.route_config ? bodyLimit(v.route_config.virtual_hosts ?? [], ctx.listener) : undefined };
    }
    const cfg = v.config;
    if (cfg?.vm_config?.runtime?.startsWith("envoy.wasm.runtime") && cfg.configuration?.value !== undefined) {
      found++;
      const where = `${path.basename(f)} ${cfg.name ?? "wasm"} configuration`;
      if (ctx?.body === undefined) fail(`${where}: not under a listener with an inline route_config: its body buffer is unknown`);
      contract(cfg.configuration.value, where, ctx?.body === undefined ? undefined : [ctx.body, ctx.listener]);
    }
    Object.values(v).forEach((x) => visit(x, ctx));
  };
  load(f).forEach((d) => visit(d, undefined));
  if (!found) fail(`${f}: no Wasm filter configuration found`);
}
fs.rmSync(scratch, { recursive: true, force: true });
process.exit(failed ? 1 : 0);
