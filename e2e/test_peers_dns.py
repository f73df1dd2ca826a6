"""Replicas found by DNS, as Envoy Gateway's patch ships the peers cluster
(deploy/envoy-gateway/generate.py --peer-port): STRICT_DNS of the replicas' headless Service,
whose name answers one address per ready replica, all on one peer port. Envoy Gateway serves
EDS only for the clusters it generates, so this is how its gateways find each other; on Istio
the same cluster is EDS from istiod, and in deploy/envoy/envoy-peers.yaml STATIC.

Three real Envoys with the real .wasm, each binding the peer port on its own loopback address
(127.0.0.2-4, as each pod has its own IP), the cluster as the generator writes it, and a DNS
server on 127.0.0.1 standing in for the cluster's DNS: the filter reads the three resolved hosts
from Envoy's admin, pulls each by override_host, tells itself by its reply, and a conversation's
later turns through the other replicas find its pod.

Every wait counts events (imported events, DNS queries), never a sleep."""

from __future__ import annotations

import argparse
import importlib.util
import json
import socket
import struct
import threading
import urllib.request

from test_peers import DEBUG, FAST, PEERS, debug, grown, opening, turn, wait_imported
from warmroute_harness import ROOT, Fleet

HOSTS = ["127.0.0.2", "127.0.0.3", "127.0.0.4"]
CARES = "type.googleapis.com/envoy.extensions.network.dns_resolver.cares.v3.CaresDnsResolverConfig"


def eg_generate():
    spec = importlib.util.spec_from_file_location("warmroute_eg_generate", ROOT / "deploy" / "envoy-gateway" / "generate.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def shared_port(hosts: list[str]) -> int:
    """A port free on every one of `hosts` (the replicas' one peer port).

    The one race in this test: another socket binding that port on 127.0.0.2-4 between this probe
    and Envoy's bind. Nothing else in the repository binds those addresses, and connections to
    127.0.0.1 take their source port on 127.0.0.1, so the chance is ~0 (well under 1e-3); if it
    happened, Envoy would fail to start and say "Address already in use", not pass wrongly."""
    for _ in range(50):
        probe = socket.socket()
        probe.bind((hosts[0], 0))
        port = probe.getsockname()[1]
        others = []
        try:
            for h in hosts[1:]:
                s = socket.socket()
                others.append(s)
                s.bind((h, port))
            return port
        except OSError:
            continue
        finally:
            probe.close()
            for s in others:
                s.close()
    raise RuntimeError(f"no port free on all of {hosts}")


class Dns:
    """A DNS server on 127.0.0.1 (UDP) answering A queries for its names, TTL 1 s; NXDOMAIN for
    any other name, no record for other types. Counts the A queries it answered."""

    def __init__(self, records: dict[str, list[str]]) -> None:
        self.records = {k.lower().rstrip("."): v for k, v in records.items()}
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.answered = 0
        self.thread = threading.Thread(target=self.serve, daemon=True)

    def __enter__(self) -> "Dns":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.sock.close()
        self.thread.join(timeout=5)

    def serve(self) -> None:
        while True:
            try:
                query, peer = self.sock.recvfrom(4096)
            except OSError:
                return
            reply = self.answer(query)
            if reply is not None:
                self.sock.sendto(reply, peer)

    def answer(self, query: bytes) -> bytes | None:
        if len(query) < 12:
            return None
        qid = struct.unpack("!H", query[:2])[0]
        i, labels = 12, []
        while i < len(query) and query[i] != 0:
            n = query[i]
            labels.append(query[i + 1:i + 1 + n].decode("ascii", "replace"))
            i += 1 + n
        if i + 5 > len(query):
            return None
        qtype = struct.unpack("!H", query[i + 1:i + 3])[0]
        question = query[12:i + 5]
        addrs = self.records.get(".".join(labels).lower())
        found = [] if addrs is None or qtype != 1 else addrs
        if found:
            self.answered += 1
        rcode = 3 if addrs is None else 0
        header = struct.pack("!HHHHHH", qid, 0x8180 | rcode, 1, len(found), 0, 0)
        records = b"".join(b"\xc0\x0c" + struct.pack("!HHIH", 1, 1, 1, 4) + socket.inet_aton(a) for a in found)
        return header + question + records


def peers_endpoints(envoy) -> set[str]:
    """The warmroute-peers cluster's hosts, as the filter reads them from Envoy's admin (Envoy
    before 1.38 ignores `filter=` and lists every cluster: the named one is picked here)."""
    url = f"http://127.0.0.1:{envoy.admin_port}/clusters?format=json&filter=%5Ewarmroute-peers%24"
    with urllib.request.urlopen(url, timeout=5) as r:
        doc = json.load(r)
    return {f"{h['address']['socket_address']['address']}:{h['address']['socket_address']['port_value']}"
            for c in doc.get("cluster_statuses", []) if c.get("name") == "warmroute-peers"
            for h in c.get("host_statuses", [])}


def test_replicas_found_by_dns_pull_each_other_as_envoy_gateway_ships_the_cluster():
    port = shared_port(HOSTS)
    cluster = eg_generate().peers_cluster(argparse.Namespace(
        gateway="llm/warmroute", proxy_namespace="envoy-gateway-system", peer_port=port))
    name = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]["socket_address"]["address"]
    assert cluster["type"] == "STRICT_DNS" and name == "warmroute-peers-warmroute.envoy-gateway-system.svc.cluster.local"
    with Dns({name: HOSTS}) as dns:
        # The one change to the shipped cluster: its resolver, this loopback DNS server instead of
        # the pod's resolv.conf (the cluster's DNS).
        cluster["typed_dns_resolver_config"] = {"name": "envoy.network.dns_resolver.cares", "typed_config": {
            "@type": CARES,
            "resolvers": [{"socket_address": {"address": "127.0.0.1", "port_value": dns.port, "protocol": "UDP"}}],
            "dns_resolver_options": {"no_default_search_domain": True}}}
        f = Fleet(3, FAST, gateways=3, config_file=PEERS, filter_overrides=DEBUG)
        for e, host in zip(f.envoys, HOSTS):
            e.peer_host, e.peer_port, e.peers_cluster, e.peer_ports = host, port, cluster, []
        with f:
            a, b, c = f.envoys
            want = {f"{h}:{port}" for h in HOSTS}
            for e in f.envoys:
                e.wait_for("the peers cluster's hosts resolved", lambda e=e: peers_endpoints(e) == want,
                           detail=lambda e=e: f"hosts {sorted(peers_endpoints(e))}, DNS answered {dns.answered}")
            talks = []
            for i in range(4):
                messages = opening(f"dns{i}-")
                r = turn(a.port, messages)
                talks.append((r.replica, grown(messages, r, f"second{i}-")))
            wait_imported(b, 4)
            wait_imported(c, 4)
            for i, (pod, messages) in enumerate(talks):
                r = turn(c.port if i % 2 else b.port, messages)
                assert (r.replica, debug(r)["reason"]) == (pod, "cache_hit"), (i, debug(r))
            # Every event named a pod the replicas share (none dropped), and the hosts came from
            # this DNS server, one query per replica at least.
            for e in (b, c):
                assert e.stat("wasmcustom.warmroute.peers.events_dropped") == 0
            assert dns.answered >= 3
