"""Pods whose sidecars require Istio mTLS (PeerAuthentication STRICT), on 127.0.0.1.

- `make_pki`: a throwaway mesh CA, a pod certificate and a gateway certificate (SPIFFE URIs as
  Istio issues them), made with the `openssl` CLI: no Python dependency.
- `write_sds`: the SDS secrets `default` (the gateway's certificate) and `ROOTCA` (the CA) as
  files, standing in for istio-agent, which serves them to Istio's proxies over `sds-grpc`.
- `Sidecars`: one Envoy with a listener per pod that terminates TLS, requires a client
  certificate signed by the CA and forwards to the pod's simulated vLLM. Its listener stats say
  how many handshakes each pod saw and why any failed.
- `MtlsEnvoy`: the gateway (`Envoy`) on deploy/envoy/envoy-mtls.yaml, its pool's endpoints marked
  `tlsMode: istio` (as istiod marks pods with a sidecar) and its SDS read from `write_sds`'s files;
  `client_cert=False` takes the certificate out of the scrape cluster only.
- `MtlsFleet`: all of it, torn down whatever happens.

`python3 -m warmroute_harness.tls DIR` writes a PKI into DIR (e.g. deploy/envoy/mtls, for a manual run of
deploy/envoy/envoy-mtls.yaml).
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from .client import free_port, get
from .envoy import Envoy, spawn_envoy, stop_envoy
from .repo import ROOT
from .sim import Sim

MTLS_CONFIG = ROOT / "deploy" / "envoy" / "envoy-mtls.yaml"
TRUST_DOMAIN = "cluster.local"
POD_ID = f"spiffe://{TRUST_DOMAIN}/ns/llm/sa/vllm"
GATEWAY_ID = f"spiffe://{TRUST_DOMAIN}/ns/istio-system/sa/istio-ingressgateway-service-account"
SECRET_TYPE = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret"
TLS_MATCH = {"filter_metadata": {"envoy.transport_socket_match": {"tlsMode": "istio"}}}


@dataclass
class Pki:
    root_cert: Path
    pod_cert: Path
    pod_key: Path
    gateway_cert: Path  # the name istio-agent's files have: cert-chain.pem, key.pem, root-cert.pem
    gateway_key: Path


def _openssl(*args: str, cwd: Path) -> None:
    r = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        raise RuntimeError(f"openssl {' '.join(args[:2])} failed: {r.stderr.strip()[-400:]}")


def make_pki(d: Path) -> Pki:
    """A CA valid for a day and two leaf certificates it signed, P-256 keys, in `d`."""
    d.mkdir(parents=True, exist_ok=True)
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", "ca-key.pem", "-out", "root-cert.pem", "-days", "1", "-subj", "/O=warmroute-test/CN=mesh root",
             "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=d)

    def leaf(name: str, spiffe: str, key: str, cert: str) -> None:
        # Istio's workload certificates: no subject, the SPIFFE identity as URI SAN, both usages.
        (d / f"{name}.ext").write_text(
            f"subjectAltName=URI:{spiffe},IP:127.0.0.1\nbasicConstraints=critical,CA:FALSE\n"
            "keyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth,clientAuth\n")
        _openssl("req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                 "-keyout", key, "-out", f"{name}.csr", "-subj", "/O=warmroute-test", cwd=d)
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "root-cert.pem", "-CAkey", "ca-key.pem",
                 "-CAcreateserial", "-days", "1", "-extfile", f"{name}.ext", "-out", cert, cwd=d)

    leaf("pod", POD_ID, "pod-key.pem", "pod-cert.pem")
    leaf("gateway", GATEWAY_ID, "key.pem", "cert-chain.pem")
    return Pki(d / "root-cert.pem", d / "pod-cert.pem", d / "pod-key.pem", d / "cert-chain.pem", d / "key.pem")


def write_sds(d: Path, pki: Pki) -> Path:
    """SDS `default` and `ROOTCA` as the files deploy/envoy/envoy-mtls.yaml reads (default.yaml,
    ROOTCA.yaml in `d`); returns `d`."""
    d.mkdir(parents=True, exist_ok=True)
    secrets = {
        "default": {"tls_certificate": {"certificate_chain": {"filename": str(pki.gateway_cert)},
                                        "private_key": {"filename": str(pki.gateway_key)}}},
        "ROOTCA": {"validation_context": {"trusted_ca": {"filename": str(pki.root_cert)}}},
    }
    for name, secret in secrets.items():
        doc = {"resources": [{"@type": SECRET_TYPE, "name": name, **secret}]}
        (d / f"{name}.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    return d


@dataclass
class Pod:
    """A pod as the gateway sees it: its sidecar's TLS port, in front of one sim."""

    name: str
    port: int
    sim: Sim

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"


class Sidecars:
    """The pods' sidecars under STRICT: one Envoy, one TLS listener per pod that requires a client
    certificate signed by the mesh CA, forwarding plain HTTP to the pod's sim."""

    def __init__(self, pods: list[Pod], pki: Pki) -> None:
        self.pods, self.pki = pods, pki
        self.admin_port = free_port()
        self.proc: subprocess.Popen | None = None

    def config(self) -> dict:
        tls = {
            "name": "envoy.transport_sockets.tls",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext",
                "require_client_certificate": True,
                "common_tls_context": {
                    "tls_certificates": [{"certificate_chain": {"filename": str(self.pki.pod_cert)},
                                          "private_key": {"filename": str(self.pki.pod_key)}}],
                    "validation_context": {"trusted_ca": {"filename": str(self.pki.root_cert)}},
                },
            },
        }
        listeners, clusters = [], []
        for p in self.pods:
            hcm = {
                "name": "envoy.filters.network.http_connection_manager",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                    "stat_prefix": p.name,
                    "route_config": {"virtual_hosts": [{"name": p.name, "domains": ["*"], "routes": [
                        {"match": {"prefix": "/"}, "route": {"cluster": p.name, "timeout": "0s"}}]}]},
                    "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}],
                },
            }
            listeners.append({
                "name": p.name,
                "stat_prefix": p.name,
                "address": {"socket_address": {"address": "127.0.0.1", "port_value": p.port}},
                "filter_chains": [{"filters": [hcm], "transport_socket": tls}],
            })
            clusters.append({
                "name": p.name, "type": "STATIC", "connect_timeout": "1s",
                "load_assignment": {"cluster_name": p.name, "endpoints": [{"lb_endpoints": [{"endpoint": {
                    "address": {"socket_address": {"address": "127.0.0.1", "port_value": p.sim.port}}}}]}]},
            })
        return {
            "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": self.admin_port}}},
            "static_resources": {"listeners": listeners, "clusters": clusters},
        }

    def start(self, logdir: Path) -> "Sidecars":
        self.proc = spawn_envoy(self.config(), f"sidecars-{self.admin_port}", logdir, self.admin_port, concurrency=1)
        return self

    def stop(self) -> None:
        stop_envoy(self.proc)

    def stats(self) -> dict[str, int]:
        text = get(self.admin_port, "/stats?filter=^listener\\.").decode()
        out = {}
        for line in text.splitlines():
            name, _, value = line.partition(": ")
            if value.strip().isdigit():
                out[name] = int(value)
        return out

    def tls(self, pod: Pod, stats: dict[str, int] | None = None) -> dict[str, int]:
        """The pod's listener's TLS counters (ssl.handshake, ssl.fail_verify_no_cert,
        ssl.connection_error, ...) without the prefix."""
        st = self.stats() if stats is None else stats
        prefix = f"listener.{pod.name}.ssl."
        return {k[len(prefix):]: v for k, v in st.items() if k.startswith(prefix)}


@dataclass
class MtlsEnvoy(Envoy):
    """The gateway on deploy/envoy/envoy-mtls.yaml: its endpoints marked tlsMode: istio, its SDS from
    `sds_dir` (write_sds), and with `client_cert=False` no certificate on the scrape cluster."""

    config_file: Path = MTLS_CONFIG
    sds_dir: Path | None = None
    client_cert: bool = True

    def render(self) -> dict:
        cfg = super().render()
        for cluster in cfg["static_resources"]["clusters"]:
            if cluster["name"] not in ("pool", "pool-metrics"):
                continue
            for ep in cluster["load_assignment"]["endpoints"][0]["lb_endpoints"]:
                ep["metadata"] = TLS_MATCH
            for m in cluster.get("transport_socket_matches", []):
                common = m["transport_socket"]["typed_config"].get("common_tls_context")
                if common is None:
                    continue
                if cluster["name"] == "pool-metrics" and not self.client_cert:
                    common.pop("tls_certificate_sds_secret_configs")
                secrets = [*common.get("tls_certificate_sds_secret_configs", []),
                           common["combined_validation_context"]["validation_context_sds_secret_config"]]
                for s in secrets:
                    src = s["sds_config"]["path_config_source"]
                    src["path"] = str(self.sds_dir / Path(src["path"]).name)
        self.config = cfg
        return cfg


class MtlsFleet:
    """N sims, each behind its sidecar (`Sidecars`), and the gateway (`MtlsEnvoy`) in front of the
    sidecars; a context manager that always tears down."""

    def __init__(self, n: int = 2, sim_args: list[str] | None = None, logdir: Path | None = None,
                 **envoy_kwargs) -> None:
        self.logdir = logdir or Path(tempfile.mkdtemp(prefix="warmroute-mtls-"))
        self.pki = make_pki(self.logdir / "pki")
        sds = write_sds(self.logdir / "sds", self.pki)
        self.sims = [Sim(f"sim-{i}", free_port(), list(sim_args or [])) for i in range(n)]
        # The filter knows each pod by its sidecar's address, as on Istio by the pod's IP:port.
        self.pods = [Pod(s.name, free_port(), s) for s in self.sims]
        self.sidecars = Sidecars(self.pods, self.pki)
        self.envoy = MtlsEnvoy(self.pods, sds_dir=sds, **envoy_kwargs)

    def __enter__(self) -> "MtlsFleet":
        try:
            for s in self.sims:
                s.start(self.logdir)
            self.sidecars.start(self.logdir)
            self.envoy.start(self.logdir)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.envoy.stop()
        self.sidecars.stop()
        for s in self.sims:
            s.stop()


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python3 -m warmroute_harness.tls DIR  (writes root-cert.pem, cert-chain.pem, key.pem, ...)")
    print(make_pki(Path(sys.argv[1])))
