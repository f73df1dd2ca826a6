// The filter's stats as Prometheus labels on Istio's proxies (istio/generate.py's
// stats-tags-gateway.yaml, stats-tags-sidecar.yaml), checked without a cluster:
//  - every namespace where warmroute runs (a Wasm EnvoyFilter or a WasmPlugin) has a ConfigMap
//    holding custom_bootstrap.json, the file the injection templates mount for the pod
//    annotation sidecar.istio.io/bootstrapOverride and point ISTIO_BOOTSTRAP_OVERRIDE at;
//  - that file sets stats_config.stats_tags and nothing else of Istio's bootstrap, with the same
//    tags as REFERENCE (envoy.yaml), and Envoy merges it, as istio-agent hands it over
//    (--config-yaml, pkg/envoy/proxy.go), over a stand-in of Istio's stats_config
//    (istio-bootstrap-stats.yaml) through `envoy --mode validate`;
//  - a gateway.networking.k8s.io Gateway (whose Deployment honours no annotation) names in
//    infrastructure.parametersRef a ConfigMap here whose keys are overlays Istio applies
//    (gatewaycommon/deploymentcontroller.go supportedOverlays) and whose `deployment` overlay
//    mounts that ConfigMap on the istio-proxy container and sets ISTIO_BOOTSTRAP_OVERRIDE to the
//    file there.
//
//   node check-stats-tags.mjs ENVOY_BIN REFERENCE_ENVOY_YAML ISTIO_DIR
import { spawnSync } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import { isDeepStrictEqual } from "node:util";
import { parse, parseAllDocuments } from "yaml";

const [envoy, reference, dir, ...extra] = process.argv.slice(2);
if (!envoy || !reference || !dir || extra.length) {
  console.error("usage: node check-stats-tags.mjs ENVOY_BIN REFERENCE_ENVOY_YAML ISTIO_DIR");
  process.exit(2);
}
let failed = 0;
const fail = (m) => { failed++; console.log(`FAIL ${m}`); };
const ok = (m) => console.log(`ok   ${m}`);

const OVERRIDE_FILE = "custom_bootstrap.json";
const OVERRIDE_VAR = "ISTIO_BOOTSTRAP_OVERRIDE";
const PROXY_CONTAINER = "istio-proxy";
const SUPPORTED_OVERLAYS = ["deployment", "service", "serviceAccount", "horizontalPodAutoscaler", "podDisruptionBudget"];
const standIn = path.join(path.dirname(new URL(import.meta.url).pathname), "istio-bootstrap-stats.yaml");

const load = (f) => parseAllDocuments(fs.readFileSync(f, "utf8")).map((d) => d.toJS()).filter(Boolean);
const yamls = (d) => (fs.existsSync(d) ? fs.readdirSync(d) : []).filter((f) => f.endsWith(".yaml")).map((f) => path.join(d, f));
const all = [...yamls(dir), ...yamls(path.join(dir, "generated"))].flatMap((f) => load(f).map((o) => ({ f, o })));
const rel = (f) => path.relative(dir, f);
const refTags = load(reference)[0]?.stats_config?.stats_tags;
if (!refTags?.length) fail(`${reference}: no stats_config.stats_tags to compare with`);

const configMaps = all.filter(({ o }) => o.kind === "ConfigMap");
const overrides = configMaps.filter(({ o }) => o.data?.[OVERRIDE_FILE] !== undefined);

// ---- each override: stats tags only, the reference's, merged by Envoy over Istio's
for (const { f, o } of overrides) {
  const where = `${rel(f)} ConfigMap ${o.metadata?.namespace}/${o.metadata?.name}`;
  let b;
  try { b = JSON.parse(o.data[OVERRIDE_FILE]); } catch (e) { fail(`${where}: ${OVERRIDE_FILE} is not JSON: ${e.message}`); continue; }
  const others = [...Object.keys(b ?? {}).filter((k) => k !== "stats_config"), ...Object.keys(b?.stats_config ?? {}).filter((k) => k !== "stats_tags").map((k) => `stats_config.${k}`)];
  if (others.length) fail(`${where}: ${OVERRIDE_FILE} also sets ${others.join(", ")}: it may set stats_config.stats_tags only, the rest of the bootstrap is Istio's`);
  else if (!isDeepStrictEqual(b.stats_config?.stats_tags, refTags)) fail(`${where}: stats_tags differ from ${path.basename(reference)}'s`);
  else ok(`${where}: the stats_tags of ${path.basename(reference)} (${refTags.map((t) => t.tag_name).join(", ")}), nothing else`);
  const r = spawnSync(envoy, ["--mode", "validate", "-c", standIn, "--config-yaml", o.data[OVERRIDE_FILE], "-l", "critical", "--log-format", "%v"], { encoding: "utf8" });
  if (r.status === 0) ok(`${where}: merged over Istio's stats_config by Envoy (--config-yaml, --mode validate)`);
  else fail(`${where}: Envoy refuses it merged over Istio's bootstrap: ${(r.stderr || r.stdout || `${r.error}`).trim().split("\n").pop()}`);
}

// ---- every namespace warmroute runs in has one
const runsIn = new Set(all.filter(({ o }) => o.kind === "WasmPlugin"
  || (o.kind === "EnvoyFilter" && (o.spec?.configPatches ?? []).some((p) => p.applyTo === "EXTENSION_CONFIG")))
  .map(({ o }) => o.metadata?.namespace ?? "default"));
for (const ns of [...runsIn].sort()) {
  const here = overrides.filter(({ o }) => (o.metadata?.namespace ?? "default") === ns);
  if (!here.length) fail(`namespace ${ns} runs warmroute but has no ConfigMap with ${OVERRIDE_FILE}: its proxies' stats stay unlabelled`);
  else ok(`namespace ${ns}: ${here.map(({ o }) => o.metadata.name).join(", ")} holds the bootstrap override`);
}

// ---- a Gateway API gateway mounts it through its parametersRef overlay
const byEnv = (c) => Object.fromEntries((c?.env ?? []).map((e) => [e.name, e.value]));
for (const { f, o: gw } of all.filter(({ o }) => o.kind === "Gateway" && String(o.apiVersion).startsWith("gateway.networking.k8s.io/"))) {
  const ns = gw.metadata?.namespace ?? "default";
  const where = `${rel(f)} Gateway ${ns}/${gw.metadata?.name}`;
  const ref = gw.spec?.infrastructure?.parametersRef;
  if (!ref) { fail(`${where}: no infrastructure.parametersRef: the Deployment Istio renders for it mounts no bootstrap override`); continue; }
  if ((ref.group ?? "") !== "" || ref.kind !== "ConfigMap") { fail(`${where}: parametersRef ${ref.group}/${ref.kind}: Istio takes a ConfigMap only`); continue; }
  const params = configMaps.find(({ o }) => o.metadata?.name === ref.name && (o.metadata?.namespace ?? "default") === ns);
  if (!params) { fail(`${where}: parametersRef ConfigMap ${ns}/${ref.name} is not here (Istio reads it from the Gateway's namespace)`); continue; }
  const unsupported = Object.keys(params.o.data ?? {}).filter((k) => !SUPPORTED_OVERLAYS.includes(k));
  if (unsupported.length) { fail(`${where}: ConfigMap ${ref.name}: unsupported overlay ${unsupported.join(", ")} (Istio applies ${SUPPORTED_OVERLAYS.join(", ")})`); continue; }
  let overlay;
  try { overlay = parse(params.o.data.deployment ?? ""); } catch (e) { fail(`${where}: ConfigMap ${ref.name}: deployment is not YAML: ${e.message}`); continue; }
  const pod = overlay?.spec?.template?.spec ?? {};
  const proxy = (pod.containers ?? []).find((c) => c.name === PROXY_CONTAINER);
  const file = byEnv(proxy)[OVERRIDE_VAR];
  const mount = (proxy?.volumeMounts ?? []).find((m) => file && path.posix.join(m.mountPath, OVERRIDE_FILE) === file);
  const volume = (pod.volumes ?? []).find((v) => v.name === mount?.name);
  const source = overrides.find(({ o }) => o.metadata?.name === volume?.configMap?.name && (o.metadata?.namespace ?? "default") === ns);
  const why = !proxy ? `no container ${PROXY_CONTAINER} in its deployment overlay`
    : !file ? `${PROXY_CONTAINER} gets no ${OVERRIDE_VAR}`
    : !mount ? `${OVERRIDE_VAR}=${file} is not ${OVERRIDE_FILE} in any of ${PROXY_CONTAINER}'s volume mounts`
    : !source ? `the volume mounted at ${mount.mountPath} is not a ConfigMap of ${ns} holding ${OVERRIDE_FILE}`
    : undefined;
  if (why) fail(`${where}: ConfigMap ${ref.name}: ${why}`);
  else ok(`${where}: its Deployment mounts ${source.o.metadata.name} at ${mount.mountPath} and sets ${OVERRIDE_VAR} (parametersRef ${ref.name})`);
}
process.exit(failed ? 1 : 0);
