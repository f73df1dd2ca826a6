#!/usr/bin/env bash
# The Envoy Gateway target (generate.py here, its output in generated/), checked without a
# cluster:
#
# 1. generated/ is what generate.py produces now (re-run from its banner's command + diff)
# 2. the GatewayClass, Gateway and HTTPRoute against the Gateway API schemas
#    (../validate-manifests.mjs)
# 3. check.mjs: the EnvoyPatchPolicy against a schema of Envoy Gateway's v1alpha1 API, its JSON
#    patches applied to stand-ins of Envoy Gateway's xDS through `envoy --mode validate`, the
#    filter's verdict on its configuration
# 4. steps 1-3 again on a run with every flag, and on the exchange between the gateway's
#    replicas (--peer-port: the headless Service and NetworkPolicy against the Kubernetes schemas)
# 5. negative tests: broken copies in a temp dir MUST be rejected by steps 1-3
#
#   deploy/envoy-gateway/check.sh    (from anywhere; exits non-zero on any failure)
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
here="$deploy/envoy-gateway"
need_validators
need_checker
need_envoy

# ---------------------------------------------------------------- 1-3. generated, schemas, check.mjs
step "Envoy Gateway: deploy/envoy-gateway (Gateway + HTTPRoute + EnvoyPatchPolicy)"
eg_args="$(sed -n 's/^#   python3 deploy\/envoy-gateway\/generate.py //p' "$here/generated/envoypatchpolicy.yaml" | head -n1)"
[[ -n "$eg_args" ]] || die "deploy/envoy-gateway/generated/envoypatchpolicy.yaml: no generate.py command line in its banner"
echo "python3 deploy/envoy-gateway/generate.py $eg_args"
check_eg_generated() { # $1 = dir of generated files, $2 = generate.py arguments
  local out="$tmp/eg-regen.$RANDOM"
  # shellcheck disable=SC2086  # word-splitting of the recorded args is intended
  (cd "$root" && python3 deploy/envoy-gateway/generate.py $2 --out "$out") >/dev/null 2>&1 || { echo "generate.py failed"; return 1; }
  diff -ru "$out" "$1"
}
check_eg_generated "$here/generated" "$eg_args" || die "deploy/envoy-gateway/generated is stale: re-run the command above and commit"
echo "ok   $(ls "$here/generated" | wc -l) files identical"
node "$deploy/validate-manifests.mjs" k8s "$here/generated/gatewayclass.yaml" "$here/generated/gateway.yaml" "$here/generated/httproute.yaml" || die "Envoy Gateway: Gateway API schema validation"
node "$here/check.mjs" "$envoy_bin" "$here/generated" || die "Envoy Gateway: EnvoyPatchPolicy checks"

# ---------------------------------------------------------------- 4. every flag
step "Envoy Gateway with every flag: --gateway, --gateway-class, --port, --config, an http:// module URL"
egf="$tmp/eg-flags"
mkdir -p "$egf"
printf '%s\n' '{"session_header": "x-conversation-id", "saturation": {"max_waiting": 8}}' >"$egf/config.json"
eg_sha="$(grep -oE -- '--wasm-sha256 [0-9a-f]{64}' <<<"$eg_args" | cut -d' ' -f2)" || die "no --wasm-sha256 in $eg_args"
eg_flag_args="--namespace models --service qwen --port 8080 --gateway infra/llm-gw --gateway-class eg-internal --external-host llm.internal --max-backends 16 --models qwen3 --wasm-url http://wasm.infra.svc.cluster.local:8080/warmroute.wasm --wasm-sha256 $eg_sha --config $egf/config.json"
echo "python3 deploy/envoy-gateway/generate.py $eg_flag_args"
# shellcheck disable=SC2086  # word-splitting of the args is intended
(cd "$root" && python3 deploy/envoy-gateway/generate.py $eg_flag_args --out "$egf/generated") >/dev/null || die "Envoy Gateway, every flag: generate.py failed"
check_eg_generated "$egf/generated" "$eg_flag_args" || die "Envoy Gateway, every flag: not reproducible"
node "$deploy/validate-manifests.mjs" k8s "$egf/generated/gatewayclass.yaml" "$egf/generated/gateway.yaml" "$egf/generated/httproute.yaml" \
  || die "Envoy Gateway, every flag: Gateway API schema validation"
node "$here/check.mjs" "$envoy_bin" "$egf/generated" || die "Envoy Gateway, every flag: EnvoyPatchPolicy checks"
python3 - "$egf/generated" <<'PY' || die "Envoy Gateway, every flag: the inputs did not reach the output"
import json, pathlib, sys
d = pathlib.Path(sys.argv[1])
cfg = json.loads((d / "pluginconfig.json").read_text())
assert cfg["session_header"] == "x-conversation-id" and cfg["saturation"]["max_waiting"] == 8, cfg
assert cfg["pool"] == {"cluster": "httproute/models/qwen/rule/0", "admin_cluster": "warmroute-envoy-admin",
                       "max_backends": 16, "models": ["qwen3"], "adapters": []}, cfg["pool"]
epp = (d / "envoypatchpolicy.yaml").read_text()
assert "  namespace: infra\n" in epp and "    name: llm-gw\n" in epp and "name: infra/llm-gw/http\n" in epp, "policy not on infra/llm-gw"
assert "uri: http://wasm.infra.svc.cluster.local:8080/warmroute.wasm\n" in epp and "port_value: 8080" in epp, "module URL"
assert "transport_socket" not in epp, "TLS to an http:// module URL"
assert "gatewayClassName: eg-internal" in (d / "gateway.yaml").read_text()
assert "kubernetes.io/metadata.name: models" in (d / "gateway.yaml").read_text()
print("ok   namespace, service, port, gateway, class, host, pool limits, module URL and --config reach every object")
PY

step "Envoy Gateway, the exchange between the gateway's replicas: --peer-port, --proxy-namespace"
egp="$tmp/eg-peers"
eg_peers_args="--namespace llm --service vllm --peer-port 15099 --proxy-namespace eg-proxies --wasm-url https://models.example.com/warmroute/0.1.0/warmroute.wasm --wasm-sha256 $eg_sha"
echo "python3 deploy/envoy-gateway/generate.py $eg_peers_args"
# shellcheck disable=SC2086  # word-splitting of the args is intended
(cd "$root" && python3 deploy/envoy-gateway/generate.py $eg_peers_args --out "$egp") >/dev/null || die "Envoy Gateway --peer-port: generate.py failed"
check_eg_generated "$egp" "$eg_peers_args" || die "Envoy Gateway --peer-port: not reproducible"
node "$deploy/validate-manifests.mjs" k8s "$egp/gatewayclass.yaml" "$egp/gateway.yaml" "$egp/httproute.yaml" "$egp/peers.yaml" "$egp/networkpolicy-peers.yaml" \
  || die "Envoy Gateway --peer-port: Gateway API and Kubernetes schema validation"
node "$here/check.mjs" "$envoy_bin" "$egp" || die "Envoy Gateway --peer-port: EnvoyPatchPolicy checks"
python3 - "$egp" <<'PY' || die "Envoy Gateway --peer-port: the inputs did not reach the output"
import json, pathlib, sys
d = pathlib.Path(sys.argv[1])
cfg = json.loads((d / "pluginconfig.json").read_text())
assert cfg["peers"] == {"cluster": "warmroute-peers", "port": 15099, "admin_cluster": "warmroute-envoy-admin"}, cfg.get("peers")
svc = (d / "peers.yaml").read_text()
assert "  name: warmroute-peers-warmroute\n  namespace: eg-proxies\n" in svc and "  clusterIP: None\n" in svc, svc
assert "    gateway.envoyproxy.io/owning-gateway-name: warmroute\n    gateway.envoyproxy.io/owning-gateway-namespace: llm\n" in svc, svc
epp = (d / "envoypatchpolicy.yaml").read_text()
assert "address: warmroute-peers-warmroute.eg-proxies.svc.cluster.local\n" in epp and "path: /additional_addresses\n" in epp, epp
assert "  namespace: eg-proxies\n" in (d / "networkpolicy-peers.yaml").read_text()
print("ok   peer port and the proxies' namespace reach the Service, the policy, the patches and the pluginConfig")
PY

# ---------------------------------------------------------------- 5. negative tests
step "negative tests (each broken copy must be rejected)"
# Envoy Gateway: each broken copy of the EnvoyPatchPolicy must be refused, for its own fault.
mkdir -p "$neg/eg"
cp "$here/generated/"* "$neg/eg/"
eg_neg() { # $1 = description, $2 = regex the rejection must say, $3 = python expression over s
  mutate "$here/generated/envoypatchpolicy.yaml" "$neg/eg/envoypatchpolicy.yaml" "$3"
  expect_reject_because "Envoy Gateway: $1" "$2" node "$here/check.mjs" "$envoy_bin" "$neg/eg"
  cp "$here/generated/envoypatchpolicy.yaml" "$neg/eg/envoypatchpolicy.yaml"
}
eg_neg "Wasm filter with allow_on_headers_stop_iteration: false" "allow_on_headers_stop_iteration is false" \
  's.replace("allow_on_headers_stop_iteration: true", "allow_on_headers_stop_iteration: false", 1)'
eg_neg "patch path that does not exist in Envoy Gateway's listener (filter_chains, not default_filter_chain)" "/filter_chains does not exist" \
  's.replace("path: /default_filter_chain/filters/0/typed_config/http_filters/0", "path: /filter_chains/0/filters/0/typed_config/http_filters/0", 1)'
eg_neg "listener named as under XDSNameSchemeV2 (tcp-80), which the default scheme does not generate" "generates no listener named tcp-80" \
  're.sub(r"name: llm/warmroute/http\n", "name: tcp-80\n", s, count=1)'
eg_neg "a copy whose from does not exist (RFC 6902 copy is applied, not skipped)" "path /nowhere: nowhere does not exist" \
  's.replace("op: add\n      path: /default_filter_chain/filters/0/typed_config/http_filters/0\n", "op: copy\n      from: /nowhere\n      path: /default_filter_chain/filters/0/typed_config/http_filters/0\n", 1)'
eg_neg "override_host on a cluster Envoy Gateway does not generate (rule/1)" "generates no cluster named httproute/llm/vllm/rule/1" \
  's.replace("name: httproute/llm/vllm/rule/0\n", "name: httproute/llm/vllm/rule/1\n", 1)'
eg_neg "scrape cluster with eds_cluster_confg (the CRD's free-form value lets it pass)" "eds_cluster_confg" \
  's.replace("eds_cluster_config:", "eds_cluster_confg:", 1)'
eg_neg "EnvoyPatchPolicy with jsonPatch instead of jsonPatches (API schema)" "additionalProperties.*jsonPatch|must NOT have additional properties \(jsonPatch\)" \
  's.replace("  jsonPatches:\n", "  jsonPatch:\n", 1)'
eg_neg "JSON patch op merge (not RFC 6902)" "must be equal to one of the allowed values" \
  's.replace("op: add", "op: merge", 1)'
eg_neg "module without its sha256 (any file at the URL would run)" "is not a sha256" \
  're.sub(r"sha256: \"[0-9a-f]{64}\"", "sha256: \"\"", s, count=1)'
eg_neg "strip of x-warmroute-backend dropped" "clients' x-warmroute-backend not stripped" \
  're.sub(r"\n *- remove: x-warmroute-backend\n", "\n", s, count=1)'
eg_neg "strip of the gate's deadline dropped" "clients' x-warmroute-deadline-ms not stripped" \
  're.sub(r"\n *- remove: x-warmroute-deadline-ms\n", "\n", s, count=1)'
eg_neg "scrape cluster whose fallback picks any pod" "not a subset policy with NO_FALLBACK" \
  's.replace("fallback_policy: NO_FALLBACK", "fallback_policy: ANY_ENDPOINT", 1)'
eg_neg "admin cluster at another port than Envoy Gateway's admin" "not a STATIC cluster of the proxy's admin" \
  's.replace("port_value: 19000", "port_value: 15000", 1)'
eg_neg "policy in another namespace than its Gateway" "is no Gateway here in namespace" \
  's.replace("  namespace: llm\n", "  namespace: other\n", 1)'
# The stats tags: the EnvoyProxy and the Gateway's reference to it.
eg_other_neg() { # $1 = file, $2 = description, $3 = regex the rejection must say, $4 = python expression over s
  mutate "$here/generated/$1" "$neg/eg/$1" "$4"
  expect_reject_because "Envoy Gateway: $2" "$3" node "$here/check.mjs" "$envoy_bin" "$neg/eg"
  cp "$here/generated/$1" "$neg/eg/$1"
}
eg_other_neg envoyproxy.yaml "EnvoyProxy bootstrap without its type (Replace: Envoy Gateway's bootstrap dropped)" "bootstrap.type unset \(Replace\), not Merge" \
  's.replace("    type: Merge\n", "", 1)'
eg_other_neg envoyproxy.yaml "EnvoyProxy bootstrap that sets more than the stats tags" "bootstrap.value also sets admin" \
  's.replace("      stats_config:\n", "      admin: {}\n      stats_config:\n", 1)'
eg_other_neg envoyproxy.yaml "EnvoyProxy whose tags differ from envoy.yaml's" "stats_tags differ from envoy.yaml's" \
  's.replace("tag_name: class", "tag_name: klass", 1)'
eg_other_neg envoyproxy.yaml "EnvoyProxy with a regex Envoy refuses" "Envoy refuses it merged over Envoy Gateway's bootstrap: .*(missing|mismatched)" \
  's.replace("regex: \"^wasmcustom", "regex: \"(^wasmcustom", 1)'
eg_other_neg envoyproxy.yaml "EnvoyProxy with bootstrap.values (API schema)" "must NOT have additional properties \(values\)" \
  's.replace("    value: |", "    values: |", 1)'
eg_other_neg gateway.yaml "Gateway without the EnvoyProxy reference" "no infrastructure.parametersRef to an EnvoyProxy" \
  're.sub(r"  infrastructure:\n    parametersRef:\n(      .*\n)+", "", s)'
mutate "$here/generated/pluginconfig.json" "$neg/eg/pluginconfig.json" 's.replace("\"max_waiting\": 4", "\"max_waiting\": 5", 1)'
expect_reject_because "Envoy Gateway: embedded configuration differs from pluginconfig.json" "configuration differs from pluginconfig.json" \
  node "$here/check.mjs" "$envoy_bin" "$neg/eg"
cp "$here/generated/pluginconfig.json" "$neg/eg/pluginconfig.json"
mutate "$here/generated/envoypatchpolicy.yaml" "$neg/eg/envoypatchpolicy.yaml" 's.replace("\"timeout_ms\": 400", "\"timeout_ms\": 600", 1)'
mutate "$here/generated/pluginconfig.json" "$neg/eg/pluginconfig.json" 's.replace("\"timeout_ms\": 400", "\"timeout_ms\": 600", 1)'
expect_reject_because "Envoy Gateway: configuration the filter refuses (metrics.timeout_ms >= period_ms)" "timeout_ms" \
  node "$here/check.mjs" "$envoy_bin" "$neg/eg"
cp "$here/generated/"* "$neg/eg/"
mutate "$here/generated/httproute.yaml" "$neg/eg/httproute.yaml" 's.replace("    timeouts:\n", "    timeout:\n", 1)'
expect_reject "Envoy Gateway: HTTPRoute rule with misspelled timeout" node "$deploy/validate-manifests.mjs" k8s "$neg/eg/httproute.yaml"
echo '# not generated' >"$neg/eg/extra.yaml"
expect_reject_because "Envoy Gateway: generated/ differs from what generate.py writes" "Only in .*eg: extra.yaml" \
  check_eg_generated "$neg/eg" "$eg_args"
rm -rf "$neg/eg"
# The exchange between the gateway's replicas: each broken copy refused for its own fault.
eg_peers_neg() { # $1 = file, $2 = description, $3 = regex the rejection must say, $4 = python expression over s
  rm -rf "$neg/egp"; cp -r "$egp" "$neg/egp"
  mutate "$egp/$1" "$neg/egp/$1" "$4"
  expect_reject_because "Envoy Gateway --peer-port: $2" "$3" node "$here/check.mjs" "$envoy_bin" "$neg/egp"
}
eg_peers_neg envoypatchpolicy.yaml "peer port not added to the listener" "peers.port 15099 is no address of this listener" \
  's.replace("port_value: 15099\n", "port_value: 15100\n", 1)'
eg_peers_neg envoypatchpolicy.yaml "peers cluster fed by EDS (Envoy Gateway serves none for it)" "type EDS: Envoy Gateway serves EDS only" \
  're.sub(r"(name: warmroute-peers\n +type: )STRICT_DNS", r"\1EDS", s, count=1)'
eg_peers_neg envoypatchpolicy.yaml "peers cluster whose fallback picks any replica" "peers.cluster warmroute-peers override_host fallback is not a subset policy with NO_FALLBACK" \
  're.sub(r"(name: warmroute-peers\n.*?)fallback_policy: NO_FALLBACK", r"\1fallback_policy: ANY_ENDPOINT", s, count=1, flags=re.S)'
eg_peers_neg envoypatchpolicy.yaml "peers cluster resolving a Service that is not here" "no Service warmroute-peers-llm in eg-proxies" \
  's.replace("address: warmroute-peers-warmroute.eg-proxies", "address: warmroute-peers-llm.eg-proxies", 1)'
eg_peers_neg envoypatchpolicy.yaml "listener patch with additional_adresses (the CRD's free-form value lets it pass)" "additional_adresses" \
  's.replace("path: /additional_addresses", "path: /additional_adresses", 1)'
eg_peers_neg peers.yaml "peers Service selecting every Gateway's proxies" "selector .* is not the gateway's pods" \
  's.replace("    gateway.envoyproxy.io/owning-gateway-name: warmroute\n", "", 1)'
eg_peers_neg peers.yaml "peers Service with a virtual IP" "not headless" \
  's.replace("  clusterIP: None\n", "  clusterIP: 10.96.0.99\n", 1)'
eg_peers_neg networkpolicy-peers.yaml "NetworkPolicy admitting the peer port from anywhere" "admits the peer port 15099 from anywhere" \
  're.sub(r"  - from:\n    - podSelector:\n(        .*\n)+    ports:\n", "  - ports:\n", s, count=1)'
rm -rf "$neg/egp"
eg_gen_neg() { (cd "$root" && python3 deploy/envoy-gateway/generate.py --namespace llm --wasm-url https://x.example/w.wasm --wasm-sha256 "$eg_sha" --out "$neg/eg-gen" "$@"); }
expect_reject_because "Envoy Gateway generate.py --peer-port on the listener's container port" "--peer-port 10080 is a port the gateway's proxies already use" \
  eg_gen_neg --peer-port 10080
expect_reject_because "Envoy Gateway generate.py --proxy-namespace without --peer-port" "--proxy-namespace is for --peer-port" \
  eg_gen_neg --proxy-namespace eg
expect_reject_because "Envoy Gateway generate.py --wasm-sha256 that is not a sha256" "--wasm-sha256 must be" \
  bash -c "cd '$root' && python3 deploy/envoy-gateway/generate.py --namespace llm --wasm-url https://x.example/w.wasm --wasm-sha256 abc --out '$neg/eg-gen'"

negatives_passed "deploy/envoy-gateway"
