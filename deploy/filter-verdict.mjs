// The filter's own verdict on a configuration, shared by every target's checks: each copy is
// handed, as Envoy would hand it (JSON text), to warmroute-check-config (the core's
// Config::parse, the same code on_configure runs), never to a schema copied by hand; --shipped
// also refuses the debug header, and --buffer-limits checks max_body_bytes against the Envoy
// buffers the filter runs under.
import { spawnSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";

// Envoy's per_connection_buffer_limit_bytes when a listener sets none.
export const ENVOY_DEFAULT_BUFFER = 1048576;

// The least any route of an HTTP connection manager may buffer per request: a route's
// request_body_buffer_limit, else its virtual host's, else the listener's limit.
export function bodyLimit(vhosts, listener) {
  let least = Infinity;
  for (const vh of vhosts) {
    for (const r of vh.routes?.length ? vh.routes : [{}]) {
      least = Math.min(least, Number(r.request_body_buffer_limit ?? vh.request_body_buffer_limit ?? listener));
    }
  }
  return least;
}

// verdict(config, where, buffers): runs the checker on config (an object or JSON text) and
// reports its one line through ok/fail, naming the copy `where`. buffers: [body, listener]
// limits in bytes, or undefined where the config runs under none known. close() removes the
// scratch files.
export function verdicts(checker, ok, fail) {
  const scratch = fs.mkdtempSync(path.join(os.tmpdir(), "warmroute-config-"));
  let seq = 0;
  const verdict = (config, where, buffers) => {
    const file = path.join(scratch, `${seq++}.json`);
    fs.writeFileSync(file, typeof config === "string" ? config : JSON.stringify(config));
    const limits = buffers ? ["--buffer-limits", buffers.join(",")] : [];
    const r = spawnSync(checker, ["--shipped", ...limits, file], { encoding: "utf8" });
    const line = (r.stdout || r.stderr || `${r.error ?? "no output"}`).trim().replace(file, where);
    if (r.status === 0) ok(line.replace(/^ok +/, ""));
    else fail(line.replace(/^FAIL +/, ""));
  };
  return { verdict, close: () => fs.rmSync(scratch, { recursive: true, force: true }) };
}
