"""What an operator sees, through the real Envoy: the filter's stats as Prometheus labels (the
shipped configs' stats_tags), the Grafana dashboard's queries against the series a real run
exported, and one request's route in the access log.

Counters reach Envoy at each VM's tick, so the checks wait until Envoy counts every request
sent (an event, never a span of seconds); waits have generous timeouts as hang guards only."""

from __future__ import annotations

import json
import re
import urllib.request

import pytest
import yaml

from warmroute_harness import MODEL, Fleet, chat, post, words
from warmroute_harness.repo import ROOT

DASHBOARD = ROOT / "deploy" / "grafana" / "warmroute-dashboard.json"
CONFIGS = [ROOT / "envoy.yaml", *sorted((ROOT / "deploy" / "envoy").glob("*.yaml"))]
# On Istio the tags reach the proxies as a bootstrap override (a ConfigMap per namespace), on
# Envoy Gateway as an EnvoyProxy's bootstrap merge: both merged over the platform's own
# bootstrap, whose stats_config each stand-in reproduces.
ISTIO_STATS = sorted((ROOT / "istio" / "generated").glob("stats-tags-*.yaml"))
EG_PROXY = ROOT / "deploy" / "envoy-gateway" / "generated" / "envoyproxy.yaml"
PLATFORM_STATS = {"istio": ROOT / "deploy" / "istio" / "istio-bootstrap-stats.yaml",
                  "envoy-gateway": ROOT / "deploy" / "envoy-gateway" / "eg-bootstrap-stats.yaml"}
SERIES = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? \S+$")
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="')
METRIC = re.compile(r"\bwarmroute_[a-z_]+\b")
BY = re.compile(r"\bby\s*\(([^)]*)\)")
# A series selector's label matchers: metric -> the names it matches on.
SELECTOR = re.compile(r"\b(warmroute_[a-z_]+)\{([^}]*)\}")
MATCHER = re.compile(r"(\w+)\s*(?:=~|!~|!=|=)")
LABEL_VALUES = re.compile(r"label_values\(\s*(warmroute_[a-z_]+)\s*,\s*(\w+)\s*\)")
LEGEND = re.compile(r"\{\{\s*(\w+)\s*\}\}")


def prometheus(admin_port: int) -> str:
    return urllib.request.urlopen(f"http://127.0.0.1:{admin_port}/stats/prometheus", timeout=10).read().decode()


def exported(text: str) -> dict[str, set[str]]:
    """Every series named warmroute_*: metric name -> label names seen."""
    out: dict[str, set[str]] = {}
    for line in text.splitlines():
        m = SERIES.match(line)
        if m and m.group(1).startswith("warmroute_"):
            out.setdefault(m.group(1), set()).update(LABEL.findall(m.group(2) or ""))
    return out


def values(text: str, metric: str, label: str) -> dict[str, float]:
    """`metric`'s samples by the value of `label`."""
    pat = re.compile(rf'^{metric}\{{(?:[^}}]*,)?{label}="([^"]*)"[^}}]*\}} (\S+)$')
    return {m.group(1): float(m.group(2)) for line in text.splitlines() if (m := pat.match(line))}


def totals(text: str, metric: str, label: str) -> dict[str, float]:
    """`metric`'s samples summed by the value of `label` (over its other labels)."""
    pat = re.compile(rf'^{metric}\{{(?:[^}}]*,)?{label}="([^"]*)"[^}}]*\}} (\S+)$')
    out: dict[str, float] = {}
    for line in text.splitlines():
        if m := pat.match(line):
            out[m.group(1)] = out.get(m.group(1), 0.0) + float(m.group(2))
    return out


def counted(f: Fleet, n: int) -> None:
    """Waits until Envoy's stats count `n` ended requests: each VM adds what it counted at its
    tick, after the request's on_log, so every counter of those requests is in by then."""
    outcomes = [f"wasmcustom.warmroute.requests.cache_aware.{o}" for o in ("2xx", "4xx", "5xx", "reset")]

    def total() -> int:
        st = f.envoy.stats()
        return sum(f.envoy.stat(name, st) for name in outcomes)

    f.envoy.wait_for(f"{n} requests counted", lambda: total() >= n, detail=lambda: f"{total()} counted")


def istio_overrides() -> dict[str, str]:
    """Each bootstrap override of istio/generated/stats-tags-*.yaml, by file and namespace."""
    return {f"{p.relative_to(ROOT)} ({d['metadata']['namespace']})": d["data"]["custom_bootstrap.json"]
            for p in ISTIO_STATS for d in yaml.safe_load_all(p.read_text())
            if "custom_bootstrap.json" in (d or {}).get("data", {})}


def eg_merge() -> dict:
    """The bootstrap the generated EnvoyProxy merges into Envoy Gateway's."""
    (proxy,) = [d for d in yaml.safe_load_all(EG_PROXY.read_text()) if d]
    return yaml.safe_load(proxy["spec"]["bootstrap"]["value"])


def test_every_shipped_config_labels_the_stats_the_same_way():
    tags = {str(p.relative_to(ROOT)): yaml.safe_load(p.read_text()).get("stats_config") for p in CONFIGS}
    overrides = istio_overrides()
    assert len(overrides) == 2, f"istio/generated: {sorted(overrides)}, not one override for the gateway and one for the sidecar"
    tags |= {where: json.loads(o).get("stats_config") for where, o in overrides.items()}
    tags[str(EG_PROXY.relative_to(ROOT))] = eg_merge().get("stats_config")
    assert all(tags.values()), f"a shipped config without stats_config: {[p for p, t in tags.items() if not t]}"
    first = next(iter(tags.values()))
    assert all(t == first for t in tags.values()), "the shipped configs' stats_tags differ"
    names = [t["tag_name"] for t in first["stats_tags"]]
    assert {"pod", "reason", "class", "model"} <= set(names), names


def test_the_dashboard_queries_only_series_a_real_run_exports():
    gate = {"gate": {"knee": {"requests": 8}}}
    with Fleet(2, ["--time-scale", "10"], filter_overrides=gate) as f:
        sent = 6
        for i in range(sent - 1):
            r = post(f.envoy.port, "/v1/chat/completions", chat(MODEL, [{"role": "user", "content": words(f"q{i}-", 300)}]))
            assert r.status == 200, r.status
        # A body that is not JSON is still proxied (the sim answers 4xx), counted as unread.
        post(f.envoy.port, "/v1/chat/completions", b"{not json")
        counted(f, sent)
        text = prometheus(f.envoy.admin_port)
        series = exported(text)

        # Tag extraction: no per-pod, per-reason or per-class metric names, only labels.
        pods = {s.name.replace("-", "_") for s in f.sims}
        flat = [n for n in series if any(p in n for p in pods) or n.startswith("warmroute_decision_")
                or n.startswith("warmroute_gate_interactive")]
        assert not flat, f"stats not turned into labels: {flat[:5]}"
        assert {"warmroute_backend_chosen", "warmroute_backend_inflight", "warmroute_backend_healthy",
                "warmroute_backend_prefill_blocks"} <= set(series), sorted(series)
        chosen = values(text, "warmroute_backend_chosen", "pod")
        assert set(chosen) == {s.name for s in f.sims}, chosen
        assert sum(chosen.values()) == sent, chosen
        reasons = values(text, "warmroute_decision", "reason")
        assert sum(reasons.values()) == sent and reasons.get("fallback") == 1, reasons
        assert values(text, "warmroute_fallback", "unread").get("not_json") == 1
        # A body the filter could not read still passes the gate (below the knee: admitted).
        assert values(text, "warmroute_gate_admitted", "class").get("standard") == sent

        # Every panel's query names series this run exported, with the labels it groups by.
        dash = json.loads(DASHBOARD.read_text())
        checked = 0
        for panel in dash["panels"]:
            for t in panel["targets"]:
                wanted = {lab.strip() for g in BY.findall(t["expr"]) for lab in g.split(",") if lab.strip()}
                wanted |= set(LEGEND.findall(t.get("legendFormat", "")))
                for metric in METRIC.findall(t["expr"]):
                    assert metric in series, f"panel {panel['title']!r}: {metric} is not exported"
                    missing = wanted - series[metric]
                    assert not missing, f"panel {panel['title']!r}: {metric} has no label {missing}"
                    checked += 1
                for metric, matchers in SELECTOR.findall(t["expr"]):
                    missing = set(MATCHER.findall(matchers)) - series.get(metric, set())
                    assert not missing, f"panel {panel['title']!r}: {metric} is selected on {missing}, not a label of it"
        assert checked >= 20, checked
        # The dashboard's variables list the values of labels the run exported.
        variables = [v for v in dash["templating"]["list"] if v["type"] == "query"]
        assert variables, "no query variable"
        for v in variables:
            for metric, label in LABEL_VALUES.findall(v["definition"]):
                assert label in series.get(metric, set()), f"variable {v['name']}: {metric} has no label {label}"


@pytest.mark.parametrize("platform", sorted(PLATFORM_STATS))
def test_mesh_targets_label_the_stats_through_a_bootstrap_merge(platform):
    """Envoy started with the platform's stats_config and the generated bootstrap fragment merged
    over it (--config-yaml: what istio-agent runs Envoy with; Envoy Gateway's merge is the same
    proto merge) labels the filter's stats; without the fragment they stay flat."""
    own = yaml.safe_load(PLATFORM_STATS[platform].read_text())["stats_config"]
    merged = (istio_overrides()["istio/generated/stats-tags-gateway.yaml (istio-system)"] if platform == "istio"
              else json.dumps(eg_merge()))
    for config_yaml in (merged, None):
        with Fleet(2, ["--time-scale", "10"], stats_config=own, config_yaml=config_yaml) as f:
            sent = 4
            for i in range(sent):
                r = post(f.envoy.port, "/v1/chat/completions", chat(MODEL, [{"role": "user", "content": words(f"i{i}-", 200)}]))
                assert r.status == 200, r.status
            counted(f, sent)
            text = prometheus(f.envoy.admin_port)
        flat = sorted(n for n in exported(text) if any(s.name.replace("-", "_") in n for s in f.sims))
        chosen = values(text, "warmroute_backend_chosen", "pod")
        if config_yaml is None:
            # The platform keeps the filter's stats, its own tags name nothing in them.
            assert not chosen and flat, (chosen, flat)
            continue
        assert not flat, f"stats not turned into labels: {flat[:5]}"
        assert set(chosen) == {s.name for s in f.sims} and sum(chosen.values()) == sent, chosen
        assert sum(values(text, "warmroute_decision", "reason").values()) == sent
        assert values(text, "warmroute_requests", "strategy").get("cache_aware") is not None
        assert totals(text, "warmroute_model_decision", "model") == {"other": sent}, "no model declared: all other"


def test_per_model_stats_carry_the_declared_models_and_nothing_a_client_names():
    """The model a request names becomes the label `model` only when the operator declared it;
    any other name a client sends (and a body not read) counts under `other`: no client can
    make Envoy mint a stat."""
    slashed, minted = "acme/tiny-1.5", "client-minted-7f3a"
    fleet = Fleet(2, ["--time-scale", "10"])
    # sim-0 declares both models; sim-1 declares nothing, so it may get any model (a name
    # neither pod serves is routed there and answered 404 by it, not by the filter).
    fleet.envoy.backend_fields = {"sim-0": {"models": [MODEL, slashed]}}
    with fleet as f:
        sent = {MODEL: 3, slashed: 2, minted: 2}
        for model, n in sent.items():
            for i in range(n):
                body = chat(model, [{"role": "user", "content": words(f"{model}-{i}-", 200)}])
                post(f.envoy.port, "/v1/chat/completions", body)
        post(f.envoy.port, "/v1/chat/completions", b"{not json")
        total = sum(sent.values()) + 1
        counted(f, total)
        text = prometheus(f.envoy.admin_port)
    series = exported(text)
    for metric in ("warmroute_model_decision", "warmroute_model_prompt_blocks", "warmroute_model_matched_blocks"):
        assert "model" in series.get(metric, set()), (metric, sorted(series))
    assert "reason" in series["warmroute_model_decision"]
    assert not [n for n in series if n.startswith("warmroute_model_") and n not in
                {"warmroute_model_decision", "warmroute_model_prompt_blocks", "warmroute_model_matched_blocks"}], \
        sorted(series)
    by_model = totals(text, "warmroute_model_decision", "model")
    assert by_model == {MODEL: 3, slashed: 2, "other": 3}, by_model
    assert sum(totals(text, "warmroute_model_decision", "reason").values()) == total
    assert minted not in text, "a client's model name reached Envoy's stats"
    prompt = totals(text, "warmroute_model_prompt_blocks", "model")
    assert prompt[MODEL] > 0 and prompt[slashed] > 0 and set(prompt) == {MODEL, slashed, "other"}, prompt
    matched = totals(text, "warmroute_model_matched_blocks", "model")
    assert all(matched[m] <= prompt[m] for m in prompt), (matched, prompt)


ROUTE_LOG = "ACCESS %REQ(X-REQUEST-ID)% %UPSTREAM_HOST% route=%FILTER_STATE(wasm.warmroute:PLAIN)%"


def test_the_access_log_explains_each_route():
    with Fleet(2, ["--time-scale", "10"], access_log=ROUTE_LOG, filter_overrides={"route_log": True}) as f:
        body = chat(MODEL, [{"role": "user", "content": words("explain-", 400)}])
        ids = [f"req-{i}" for i in range(3)]
        for i, rid in enumerate(ids):
            assert post(f.envoy.port, "/v1/chat/completions", body, {"x-request-id": rid}).status == 200
            # Ended in the filter too (its prompt no longer pending), not only at the client:
            # then the next one finds it in the pod's cache, whatever the timing.
            counted(f, i + 1)
        post(f.envoy.port, "/v1/chat/completions", b"{not json", {"x-request-id": "unread"})
        sims = {s.address: s.name for s in f.sims}

        def logged():
            lines = [ln.split() for ln in f.envoy.log_path.read_text().splitlines() if ln.startswith("ACCESS ")]
            by_id = {ln[1]: ln for ln in lines if len(ln) == 4}
            return by_id if set(ids) | {"unread"} <= set(by_id) else None

        by_id = f.envoy.wait_for("the four requests in the access log", logged, timeout=30)
        notes = {}
        for rid in ids:
            _, _, upstream, route = by_id[rid]
            fields = dict(kv.split("=", 1) for kv in route.removeprefix("route=").split(";"))
            # The pod the filter chose is the one Envoy sent the request to.
            assert fields["backend"] == sims[upstream], (rid, upstream, route)
            notes[rid] = fields
        assert notes["req-0"]["reason"] == "placed" and notes["req-0"]["match"].startswith("0/")
        # The same prompt again, once the first was answered: a hit on the same pod.
        assert notes["req-2"]["reason"] == "cache_hit", notes
        assert notes["req-2"]["backend"] == notes["req-0"]["backend"]
        assert by_id["unread"][3].endswith(";fallback=not_json"), by_id["unread"]
