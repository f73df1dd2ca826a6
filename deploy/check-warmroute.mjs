// Cross-checks between warmroute's Istio manifests that no schema can express:
//  - every WasmPlugin's spec.pluginConfig and every generated EnvoyFilter's embedded JSON
//    equals istio/generated/pluginconfig.json (no hand-copied drift);
//  - the plugin config obeys the filter's contract (/tmp/contract/config.md, summarised in
//    the README): known keys only, backend names/addresses well-formed and unique, enums;
//  - header mode: each backend name has a DestinationRule subset and a VirtualService header
//    match routing to it (a missing one is a 503 "no healthy upstream" in production).
//
//   node check-warmroute.mjs ISTIO_DIR
import fs from "node:fs";
import path from "node:path";
import { isDeepStrictEqual } from "node:util";
import { parseAllDocuments } from "yaml";

const dir = process.argv[2];
if (!dir) {
  console.error("usage: node check-warmroute.mjs ISTIO_DIR");
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

// ---- contract check of the reference config
const TOP = new Set(["backends", "strategy", "route", "block_bytes", "max_body_bytes", "session_header", "balance",
  "cache_aware", "saturation", "index", "metrics", "debug_header"]);
const SUB = {
  route: ["mode", "header", "fallbacks"], balance: ["eps", "warm_min_cap"], cache_aware: ["tie_margin", "min_match_blocks", "prefill_slack_tokens"],
  saturation: ["max_waiting", "max_kv_usage", "max_inflight"], index: ["max_blocks", "ttl_ms", "log_bytes"],
  metrics: ["enabled", "cluster", "path", "period_ms", "timeout_ms", "unhealthy_after", "stale_after_ms",
    "model_name", "names"],
};
const STRATEGIES = ["cache_aware", "prefix_hash", "least_request", "round_robin", "random", "sticky_session"];
function contract(c, where) {
  const errs = [];
  for (const k of Object.keys(c)) if (!TOP.has(k)) errs.push(`unknown field "${k}"`);
  for (const [k, keys] of Object.entries(SUB)) {
    for (const kk of Object.keys(c[k] ?? {})) if (!keys.includes(kk)) errs.push(`unknown field "${k}.${kk}"`);
  }
  const b = c.backends;
  if (!Array.isArray(b) || b.length < 1 || b.length > 1024) errs.push("backends: need 1..=1024 entries");
  const names = new Set();
  for (const [i, x] of (b ?? []).entries()) {
    for (const k of Object.keys(x)) if (!["name", "address", "host", "metrics_path"].includes(k)) errs.push(`backends[${i}]: unknown field "${k}"`);
    if (!/^[A-Za-z0-9._-]+$/.test(x.name ?? "")) errs.push(`backends[${i}].name invalid: ${x.name}`);
    if (names.has(x.name)) errs.push(`backends[${i}].name duplicate: ${x.name}`);
    names.add(x.name);
    if (!/^(\d{1,3}(\.\d{1,3}){3}|\[[0-9a-fA-F:.]+\]):\d{1,5}$/.test(x.address ?? "")) errs.push(`backends[${i}].address must be ip:port: ${x.address}`);
  }
  if (c.strategy !== undefined && !STRATEGIES.includes(c.strategy)) errs.push(`strategy: ${c.strategy}`);
  if (c.route && !["endpoint", "header", "authority"].includes(c.route.mode)) errs.push(`route.mode: ${c.route.mode}`);
  if (c.block_bytes !== undefined && !(c.block_bytes >= 16 && c.block_bytes <= 65536)) errs.push("block_bytes out of 16..=65536");
  for (const e of errs) fail(`${where}: ${e}`);
  if (!errs.length) ok(`${where}: plugin config matches the filter's schema (${b.length} backends, ${c.route?.mode ?? "endpoint"} mode)`);
}
contract(ref, "generated/pluginconfig.json");

// ---- every embedded copy equals the generated one
for (const { f, o } of all) {
  const rel = path.relative(dir, f);
  if (o.kind === "WasmPlugin") {
    if (isDeepStrictEqual(o.spec?.pluginConfig, ref)) ok(`${rel}: pluginConfig == generated/pluginconfig.json`);
    else {
      fail(`${rel}: spec.pluginConfig differs from generated/pluginconfig.json (re-run generate.py and copy it)`);
      contract(o.spec?.pluginConfig ?? {}, rel);
    }
  }
  if (o.kind === "EnvoyFilter") {
    for (const p of o.spec?.configPatches ?? []) {
      const cfg = p.patch?.value?.typed_config?.config;
      if (p.applyTo !== "EXTENSION_CONFIG" || !cfg) continue;
      let embedded;
      try { embedded = JSON.parse(cfg.configuration?.value ?? "null"); } catch (e) { fail(`${rel}: configuration.value is not JSON: ${e.message}`); continue; }
      if (isDeepStrictEqual(embedded, ref)) ok(`${rel}: embedded configuration == generated/pluginconfig.json`);
      else fail(`${rel}: embedded configuration differs from generated/pluginconfig.json`);
      if (cfg.allow_on_headers_stop_iteration !== true) fail(`${rel}: allow_on_headers_stop_iteration must be true`);
      else ok(`${rel}: allow_on_headers_stop_iteration: true`);
      // The ECDS name must match the HTTP filter that references it.
      const names = (o.spec.configPatches ?? []).filter((q) => q.applyTo === "HTTP_FILTER").map((q) => q.patch?.value?.name);
      if (!names.includes(p.patch.value.name)) fail(`${rel}: no HTTP_FILTER references extension ${p.patch.value.name}`);
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
process.exit(failed ? 1 : 0);
