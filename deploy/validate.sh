#!/usr/bin/env bash
# Validate warmroute's deployment artefacts without a cluster or a Docker daemon: each target's
# checks, from its own folder (deploy/README.md says what each one is). Every check.sh also runs
# alone; here the validators, the filter's configuration parser and Envoy are found once.
#
#   deploy/validate.sh            (from anywhere; exits non-zero on any failure)
#
# The OCI image and the release are checked by pytest (make validate-oci), the standalone
# configs also by `envoy --mode validate` (make validate-envoy): both need the built module.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
need_validators
need_checker
need_envoy
for target in envoy istio envoy-gateway compose; do
  "$deploy/$target/check.sh" || die "deploy/$target/check.sh"
done
printf '\nvalidate.sh: all deployment checks passed\n'
