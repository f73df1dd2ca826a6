"""Who may set what, through the real Envoy: the headers only warmroute or a trusted stage
before it may set never come from a client (README, Security; docs/security.md).

The pods echo the request headers they received (`warmroute-sim --echo-request-headers`), so
each test reads what reached the pod, not what Envoy's own header map held."""

from __future__ import annotations

import base64
import collections
import json
import re
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from warmroute_harness import MODEL, ROOT, Fleet, chat, post
from warmroute_harness.tls import MtlsFleet

ECHO = ["--time-scale", "20", "--echo-request-headers"]
# Every header only warmroute (routing, the published model) or a stage before it (the gate's
# class and deadline) may set.
TRUSTED = {
    "x-gateway-destination-endpoint": None,  # the target pod's address, filled in per fleet
    "x-warmroute-backend": None,  # the target pod's name
    "x-gateway-model-name": "forged-model",
    "x-warmroute-priority": "interactive",
    "x-gateway-inference-objective": "critical",
    "x-warmroute-deadline-ms": "1",
}
# Every shipped Envoy config: the root's and the variants, wherever they are kept.
SHIPPED = [ROOT / "envoy.yaml", *sorted((ROOT / "deploy" / "envoy").glob("*.yaml")),
           *sorted((ROOT / "deploy" / "envoy").glob("*.yaml"))]


def seen(reply) -> list[tuple[str, str]]:
    """The request headers the pod received, in order."""
    return [tuple(p) for p in json.loads(reply.headers["x-sim-request-headers"])]


def test_every_shipped_config_is_checked():
    # The root config and the four variants; a move of the variants must not shrink this.
    assert len(SHIPPED) >= 5, SHIPPED


@pytest.mark.parametrize("config", SHIPPED, ids=lambda p: p.name)
def test_without_the_filter_no_client_sets_what_only_warmroute_or_a_trusted_stage_may(config):
    # The filter absent, as after a VM crash that fails open: Envoy itself must have dropped
    # every trusted header, and a Host naming a pod (authority mode's per-pod routes match on
    # it) must not pick it. Without the filter the pool spreads requests round robin, one
    # counter per worker moving on at each request: 30 requests all on the named pod would
    # mean the client picked it.
    mtls = "envoy-mtls" in config.name
    fleet = (MtlsFleet(3, ECHO, with_filter=False) if mtls
             else Fleet(3, ECHO, config_file=config, with_filter=False))
    with fleet as f:
        target = f.sims[0]
        forged = {**TRUSTED, "x-gateway-destination-endpoint": f.envoy.sims[0].address,
                  "x-warmroute-backend": target.name, "Host": target.name}
        served = collections.Counter()
        for i in range(30):
            r = post(f.envoy.port, "/v1/chat/completions",
                     chat(MODEL, [{"role": "user", "content": f"forged {i}"}]), forged)
            assert r.status == 200, (r.status, r.body[:200])
            served[r.replica] += 1
            leaked = [(k, v) for k, v in seen(r) if k in TRUSTED]
            assert not leaked, f"{config.name}: the pod saw the client's {leaked}"
        assert served[target.name] < 30, (config.name, served)


def test_a_model_with_a_line_break_reaches_the_pod_without_the_model_header():
    with Fleet(3, ECHO, filter_overrides={"route": {"model_header": "x-gateway-model-name"}}) as f:
        # The header is written for a plain model, so its absence below is the filter's doing.
        r = post(f.envoy.port, "/v1/chat/completions", chat(MODEL, [{"role": "user", "content": "hi"}]))
        assert r.status == 200 and ("x-gateway-model-name", MODEL) in seen(r), seen(r)
        body = json.dumps(chat("a\r\nx-injected: 1", [{"role": "user", "content": "hi"}]))
        assert "a\\r\\nx-injected: 1" in body, "JSON-escaped in the body"
        r = post(f.envoy.port, "/v1/chat/completions", body.encode())
        # The pod answers it, as it would without warmroute: no such model.
        assert r.replica is not None, (r.status, r.body[:200])
        assert r.status == 404, (r.status, r.body[:200])
        names = [k for k, _ in seen(r)]
        assert "x-injected" not in names and "x-gateway-model-name" not in names, seen(r)


# --- a class from a verified token: the README's jwt_authn block, run as written -------------

def readme_recipe(path: Path) -> str:
    text = path.read_text()
    m = re.search(r"<!-- jwt-recipe -->\n```yaml\n(.*?)```\n", text, re.S)
    assert m, f"{path}: no jwt-recipe block"
    return m.group(1)


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


class Signer:
    """An RSA key made with the openssl CLI (no Python dependency): its JWKS and RS256 tokens."""

    def __init__(self, where: Path, kid: str) -> None:
        self.kid = kid
        self.key = where / f"{kid}.pem"
        subprocess.run(["openssl", "genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048",
                        "-out", str(self.key)], check=True, capture_output=True)
        out = subprocess.run(["openssl", "rsa", "-in", str(self.key), "-noout", "-modulus"],
                             check=True, capture_output=True, text=True).stdout
        modulus = bytes.fromhex(out.strip().split("=", 1)[1])
        # genpkey's public exponent is 65537.
        self.jwk = {"kty": "RSA", "alg": "RS256", "use": "sig", "kid": kid, "n": b64url(modulus), "e": "AQAB"}

    def token(self, claims: dict) -> str:
        header = {"alg": "RS256", "typ": "JWT", "kid": self.kid}
        signing_input = f"{b64url(json.dumps(header).encode())}.{b64url(json.dumps(claims).encode())}"
        sig = subprocess.run(["openssl", "dgst", "-sha256", "-sign", str(self.key)],
                             input=signing_input.encode(), check=True, capture_output=True).stdout
        return f"{signing_input}.{b64url(sig)}"


def test_the_readme_and_the_docs_show_the_same_recipe():
    assert readme_recipe(ROOT / "README.md") == readme_recipe(ROOT / "docs" / "security.md")


def test_a_class_comes_from_a_verified_token_not_from_the_client(tmp_path):
    recipe = yaml.safe_load(readme_recipe(ROOT / "README.md"))
    [jwt_filter] = recipe
    provider = next(iter(jwt_filter["typed_config"]["providers"].values()))
    [claim] = [c["claim_name"] for c in provider["claim_to_headers"] if c["header_name"] == "x-warmroute-priority"]
    idp, stranger = Signer(tmp_path, "idp"), Signer(tmp_path, "stranger")
    # No network: the provider's keys inline instead of its remote JWKS.
    provider.pop("remote_jwks")
    provider["local_jwks"] = {"inline_string": json.dumps({"keys": [idp.jwk]})}
    cfg = yaml.safe_load((ROOT / "envoy.yaml").read_text())
    hcm = cfg["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    wasm = next(i for i, f in enumerate(hcm["http_filters"]) if f["name"] == "envoy.filters.http.wasm")
    hcm["http_filters"].insert(wasm, jwt_filter)
    config = tmp_path / "envoy-jwt.yaml"
    config.write_text(yaml.safe_dump(cfg, sort_keys=False))

    def bearer(signer: Signer, cls: str) -> dict:
        claims = {"iss": provider["issuer"], "aud": provider["audiences"][0], "exp": int(time.time()) + 3600,
                  claim: cls}
        return {"authorization": f"Bearer {signer.token(claims)}"}

    # A knee no request reaches: every request is admitted at once, counted under its class.
    gate = {"gate": {"knee": {"requests": 1000}}}
    with Fleet(3, ECHO, config_file=config, filter_overrides=gate) as f:
        def ask(i: int, headers: dict):
            return post(f.envoy.port, "/v1/chat/completions",
                        chat(MODEL, [{"role": "user", "content": f"q{i}"}]), headers)

        for i in range(3):
            r = ask(i, bearer(idp, "interactive"))
            assert r.status == 200, (r.status, r.body[:200])
        for i in range(3):
            # The client's own class header beside a token that says batch: the token's wins,
            # and it is the only copy the pod sees.
            r = ask(10 + i, {**bearer(idp, "batch"), "x-warmroute-priority": "interactive"})
            assert r.status == 200, (r.status, r.body[:200])
            assert [v for k, v in seen(r) if k == "x-warmroute-priority"] == ["batch"], seen(r)
        for i in range(3):
            # No token: the client's class and objective headers are ignored.
            r = ask(20 + i, {"x-warmroute-priority": "interactive", "x-gateway-inference-objective": "critical"})
            assert r.status == 200, (r.status, r.body[:200])
        # A token the provider never signed: refused before the filter.
        r = ask(30, bearer(stranger, "interactive"))
        assert r.status == 401 and r.replica is None, (r.status, r.body[:200])
        stats = f.envoy.settled_stats()
        admitted = {c: stats.get(f"wasmcustom.warmroute.gate.{c}.admitted") for c in ("interactive", "standard", "batch")}
        assert admitted == {"interactive": "3", "standard": "3", "batch": "3"}, admitted
