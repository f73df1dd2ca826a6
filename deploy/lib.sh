# Shared by deploy/validate.sh and each target's check.sh (sourced, not run): the repository's
# paths, a scratch directory removed on exit, the validators and the tools every check needs,
# and the helpers of the negative tests.
set -euo pipefail

deploy="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$deploy/.." && pwd)"
istio="$root/istio"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

step() { printf '\n== %s\n' "$*"; }
die() { printf 'FAIL: %s\n' "$*" >&2; exit 1; }

command -v node >/dev/null || die "node not found (need Node.js >= 20)"
command -v npm >/dev/null || die "npm not found"
command -v python3 >/dev/null || die "python3 not found"

# The node validators, once into deploy/node_modules with `npm ci` (pinned by
# deploy/package-lock.json; re-installed only when the lock file changes).
need_validators() {
  local stamp="$deploy/node_modules/.warmroute-lock.sha256" want
  want="$(sha256sum "$deploy/package-lock.json" | cut -d' ' -f1)"
  [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]] && return 0
  step "validators (deploy/node_modules)"
  echo "installing from deploy/package-lock.json (npm ci)"
  (cd "$deploy" && npm ci --no-audit --no-fund --loglevel=error --engine-strict=false) \
    || die "npm ci failed"
  echo "$want" >"$stamp"
}

# The filter's own configuration parser (the core's Config::parse), which every check hands
# each shipped configuration to: $WARMROUTE_CHECK_CONFIG, else built here.
need_checker() {
  [[ -n "${WARMROUTE_CHECK_CONFIG:-}" && -x "$WARMROUTE_CHECK_CONFIG" ]] && return 0
  (cd "$root" && cargo build -q --release -p warmroute-core --bin warmroute-check-config) \
    || die "cannot build warmroute-check-config"
  export WARMROUTE_CHECK_CONFIG="${CARGO_TARGET_DIR:-$root/target}/release/warmroute-check-config"
}

# Envoy 1.40 from `make setup` (or $ENVOY), into envoy_bin.
need_envoy() {
  envoy_bin="${ENVOY:-$(ls "$root"/.venv/lib/python3*/site-packages/envoy/_bin/envoy 2>/dev/null | head -n1)}"
  [[ -x "$envoy_bin" ]] || die "no Envoy binary: make setup installs Envoy 1.40 into .venv (or set ENVOY)"
  export ENVOY="$envoy_bin"
}
envoy_version() { "$envoy_bin" --version | grep -o '[0-9]*\.[0-9]*\.[0-9]*/' | tr -d /; }

# ---- negative tests: broken copies in $neg must be rejected, each for its own fault
neg="$tmp/neg"
mkdir -p "$neg"
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
negatives_passed() { # $1 = the target, named in the verdict
  (( neg_failed == 0 )) || die "$1: $neg_failed negative test(s) were not rejected: the validators are too lax"
  printf '\n%s: all checks passed\n' "$1"
}
