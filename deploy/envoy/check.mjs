// warmroute's standalone Envoy configs (envoy.yaml, deploy/envoy/*.yaml), checked where no
// schema can: every warmroute Wasm filter's configuration gets the filter's own verdict
// (../filter-verdict.mjs), with max_body_bytes checked against the buffers it runs under: the
// listener's per_connection_buffer_limit_bytes and the least request_body_buffer_limit of the
// routes of its connection manager's inline route_config. (`make validate-envoy` runs each file
// through `envoy --mode validate`.)
//
//   WARMROUTE_CHECK_CONFIG=path/to/warmroute-check-config node check.mjs ENVOY_YAML...
import fs from "node:fs";
import path from "node:path";
import { parseAllDocuments } from "yaml";
import { bodyLimit, ENVOY_DEFAULT_BUFFER, verdicts } from "../filter-verdict.mjs";

const configs = process.argv.slice(2);
const checker = process.env.WARMROUTE_CHECK_CONFIG;
if (!configs.length || !checker) {
  console.error("usage: WARMROUTE_CHECK_CONFIG=BIN node check.mjs ENVOY_YAML...");
  process.exit(2);
}
let failed = 0;
const fail = (m) => { failed++; console.log(`FAIL ${m}`); };
const ok = (m) => console.log(`ok   ${m}`);
const { verdict, close } = verdicts(checker, ok, fail);

for (const f of configs) {
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
      verdict(cfg.configuration.value, where, ctx?.body === undefined ? undefined : [ctx.body, ctx.listener]);
    }
    Object.values(v).forEach((x) => visit(x, ctx));
  };
  parseAllDocuments(fs.readFileSync(f, "utf8"), { merge: true })
    .map((d) => d.toJS({ maxAliasCount: 100 })).filter(Boolean)
    .forEach((d) => visit(d, undefined));
  if (!found) fail(`${f}: no Wasm filter configuration found`);
}
close();
process.exit(failed ? 1 : 0);
