#!/usr/bin/env bash
# The standalone Envoy configs (envoy.yaml at the top, its variants here): every warmroute Wasm
# filter's configuration through the filter's own parser, with max_body_bytes against the
# buffers it runs under (check.mjs), then broken copies that must be rejected. `make
# validate-envoy` runs each file through `envoy --mode validate` (it needs the built module).
#
#   deploy/envoy/check.sh        (from anywhere; exits non-zero on any failure)
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
here="$deploy/envoy"
need_validators
need_checker

step "standalone Envoy configs: the filter's verdict on each configuration (check.mjs)"
node "$here/check.mjs" "$root/envoy.yaml" "$here"/*.yaml || die "standalone Envoy configs"

step "negative tests (each broken copy must be rejected)"
envoy_neg() { # $1 = description, $2 = regex the rejection must say, $3 = python expression over s
  mutate "$root/envoy.yaml" "$neg/envoy.yaml" "$3"
  expect_reject_because "envoy.yaml $1" "$2" node "$here/check.mjs" "$neg/envoy.yaml"
}
envoy_neg "configuration with metrics.timeout_ms >= period_ms" "metrics.timeout_ms: must be shorter than metrics.period_ms" \
  's.replace("\"timeout_ms\": 400", "\"timeout_ms\": 600", 1)'
envoy_neg "configuration with the debug header on" "debug_header: must be off in a shipped configuration" \
  's.replace("\"strategy\": \"cache_aware\",", "\"strategy\": \"cache_aware\", \"debug_header\": true,", 1)'
envoy_neg "whose body buffer leaves no room past max_body_bytes" "plus one socket read \(1048576 \+ 16384\) is 9453568, over the 8388608 bytes" \
  's.replace("request_body_buffer_limit: 16777216", "request_body_buffer_limit: 8388608", 1)'
envoy_neg "whose listener reads as much as the body buffer holds" "plus one socket read \(16777216 \+ 16384\) is 25182208, over the 16777216 bytes" \
  's.replace("per_connection_buffer_limit_bytes: 1048576", "per_connection_buffer_limit_bytes: 16777216", 1)'

negatives_passed "deploy/envoy"
