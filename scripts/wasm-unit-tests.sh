#!/usr/bin/env bash
# The core's unit tests compiled to wasm32-unknown-unknown and run by wasm-bindgen-test
# under Node, so 32-bit `usize` and wasm arithmetic are covered (the same tests as
# `cargo test -p warmroute-core`; every test module imports
# `wasm_bindgen_test::wasm_bindgen_test as test` on wasm32).
#
#   scripts/wasm-unit-tests.sh              # debug build
#   scripts/wasm-unit-tests.sh --release    # extra args go to `cargo test`
#
# Installs wasm-bindgen-test-runner (wasm-bindgen-cli) only when it is missing or is not
# exactly the wasm-bindgen version in Cargo.lock (the runner and the library must match).
set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
TARGET=wasm32-unknown-unknown

die() { echo "wasm-unit-tests: $*" >&2; exit 1; }

command -v node >/dev/null || die "node not found (Node is wasm-bindgen-test's runtime)"
rustup target list --installed 2>/dev/null | grep -qx "$TARGET" || rustup target add "$TARGET" \
    || die "cannot add rustup target $TARGET"

# Exact wasm-bindgen version from Cargo.lock.
WB_VERSION=$(awk '/^name = "wasm-bindgen"$/ { getline; gsub(/^version = "|"$/, ""); print; exit }' Cargo.lock)
[[ -n "$WB_VERSION" ]] || die "wasm-bindgen not found in Cargo.lock"

CARGO_BIN="${CARGO_HOME:-$HOME/.cargo}/bin"
export PATH="$CARGO_BIN:$PATH"
have=$(wasm-bindgen-test-runner --version 2>/dev/null | awk '{print $2}')
if [[ "$have" != "$WB_VERSION" ]]; then
    echo "wasm-unit-tests: installing wasm-bindgen-cli $WB_VERSION (have: ${have:-none}); one-time build of a few minutes"
    if ! cargo install wasm-bindgen-cli --version "$WB_VERSION" --locked; then
        # --locked fails when a crate pinned in wasm-bindgen-cli's own lock file is
        # unavailable from the registry (e.g. yanked); resolve afresh instead.
        echo "wasm-unit-tests: --locked install failed; retrying without --locked" >&2
        cargo install wasm-bindgen-cli --version "$WB_VERSION" || die "cannot install wasm-bindgen-cli $WB_VERSION"
    fi
fi

export CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_RUNNER=wasm-bindgen-test-runner

LOG=$(mktemp)
trap 'rm -f "$LOG"' EXIT
start=$SECONDS
cargo test -p warmroute-core --lib --target "$TARGET" "$@" 2>&1 | tee "$LOG"
status=${PIPESTATUS[0]}
elapsed=$((SECONDS - start))

# Sum the "test result:" lines (one per test binary).
read -r passed failed ignored < <(awk '/^test result:/ {
        for (i = 1; i <= NF; i++) {
            if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i; if ($(i+1) ~ /^ignored/) g += $i
        } } END { print p+0, f+0, g+0 }' "$LOG")
if [[ $status -eq 0 && $passed -gt 0 ]]; then
    verdict=OK
elif [[ $status -eq 0 ]]; then
    verdict="FAILED (no tests ran)"; status=1
else
    verdict="FAILED (exit $status)"
fi
echo "wasm32 unit tests ($TARGET, wasm-bindgen $WB_VERSION, Node $(node --version)): $verdict: $passed passed, $failed failed, $ignored ignored in ${elapsed}s"
exit "$status"
