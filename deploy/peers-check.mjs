// The Kubernetes side of the exchange between a gateway's replicas (pluginConfig `peers`), shared by
// deploy/istio/check-warmroute.mjs and deploy/envoy-gateway/check.mjs. Each replica serves its
// recent index events on the peer port (peers.port), to the other replicas only:
//  - the replicas are found through a headless Service selecting the gateway's pods on that port
//    (no virtual IP: each pull names its replica);
//  - no other Service selecting those pods carries the port (a Service in front of clients would
//    let them read which prefixes are warm on which pod);
//  - a NetworkPolicy selecting those pods admits the port from those pods only, if there is one.
//
// Each function returns [ok messages, failures]; the callers print them their own way.

const isObject = (v) => v !== null && typeof v === "object" && !Array.isArray(v);
const selects = (selector, podLabels) => isObject(selector) && Object.keys(selector).length > 0
  && Object.entries(selector).every(([k, v]) => podLabels[k] === v);
const sameLabels = (a, b) => JSON.stringify(Object.entries(a ?? {}).sort()) === JSON.stringify(Object.entries(b ?? {}).sort());
// The port a Service port sends to on the pod: targetPort, or the port itself when unset.
const target = (p) => Number(p.targetPort ?? p.port);

// The headless Service(s) in `namespace` selecting exactly the gateway's pods (`podLabels`) on
// `port`: the one `host` names (<name>.<namespace>.svc.cluster.local), if given.
export function peerServices(objects, { namespace, podLabels, port, host, who }) {
  const oks = [], fails = [];
  const services = objects.filter(({ o }) => o.kind === "Service" && (o.metadata?.namespace ?? "default") === namespace);
  const named = host ? services.filter(({ o }) => `${o.metadata?.name}.${namespace}.svc.cluster.local` === host) : services;
  if (host && !named.length) {
    fails.push(`${who}: no Service ${host.split(".")[0]} in ${namespace} here: the peers cluster's replicas come from nowhere`);
    return [oks, fails];
  }
  const candidates = named.filter(({ o }) => (o.spec?.ports ?? []).some((p) => Number(p.port) === port));
  if (!candidates.length) {
    fails.push(`${who}: no Service in ${namespace}${host ? ` named ${host}` : ""} with port ${port}: the peers cluster has no replica`);
    return [oks, fails];
  }
  for (const { f, o } of candidates) {
    const at = `${f} Service ${namespace}/${o.metadata?.name}`;
    const sp = o.spec.ports.find((p) => Number(p.port) === port);
    const why = o.spec?.clusterIP !== "None" ? `not headless (clusterIP ${o.spec?.clusterIP ?? "unset"}): a virtual IP any pod may send the peer port to, balanced over the replicas`
      : !sameLabels(o.spec?.selector, podLabels) ? `selector ${JSON.stringify(o.spec?.selector ?? {})} is not the gateway's pods ${JSON.stringify(podLabels)}`
      : target(sp) !== port ? `port ${port} goes to the pods' ${target(sp)}, not the peer port ${port}`
      : (sp.protocol ?? "TCP") !== "TCP" ? `protocol ${sp.protocol}, not TCP`
      : undefined;
    if (why) fails.push(`${at}: ${why}`);
    else oks.push(`${at}: headless, the gateway's pods on the peer port ${port}`);
  }
  return [oks, fails];
}

// No Service but a headless one sends the peer port to the gateway's pods: any other faces clients
// (the client-facing LoadBalancer above all).
export function noClientService(objects, { podLabels, namespace, port, who }) {
  const oks = [], fails = [];
  for (const { f, o } of objects.filter(({ o }) => o.kind === "Service" && (o.metadata?.namespace ?? "default") === namespace)) {
    if (!selects(o.spec?.selector, podLabels) || o.spec?.clusterIP === "None") continue;
    for (const p of o.spec?.ports ?? []) {
      if (target(p) === port) fails.push(`${f} Service ${namespace}/${o.metadata?.name}: port ${p.port} sends to the gateway's peer port ${port}: its clients would read the replicas' events`);
    }
  }
  if (!fails.length) oks.push(`${who}: no Service but a headless one reaches the peer port ${port}`);
  return [oks, fails];
}

// Every NetworkPolicy selecting the gateway's pods admits the peer port from those pods only
// (other policies add up with it, so one rule admitting the port from anywhere opens it). None is
// required: the recipe is for clusters whose CNI enforces NetworkPolicy.
export function peerNetworkPolicies(objects, { namespace, podLabels, port, who }) {
  const oks = [], fails = [];
  const admits = (rule) => !(rule.ports?.length) || rule.ports.some((p) => (p.protocol ?? "TCP") === "TCP"
    && (p.port === undefined || (Number(p.port) <= port && port <= Number(p.endPort ?? p.port))));
  const fromGateway = (peer) => isObject(peer) && Object.keys(peer).length === 1 && isObject(peer.podSelector)
    && Object.keys(peer.podSelector).every((k) => k === "matchLabels") && selects(peer.podSelector.matchLabels, podLabels);
  for (const { f, o } of objects.filter(({ o }) => o.kind === "NetworkPolicy" && (o.metadata?.namespace ?? "default") === namespace)) {
    const sel = o.spec?.podSelector ?? {};
    const appliesHere = (!sel.matchLabels || selects(sel.matchLabels, podLabels) || !Object.keys(sel.matchLabels).length) && !sel.matchExpressions;
    if (!appliesHere) continue;
    const at = `${f} NetworkPolicy ${namespace}/${o.metadata?.name}`;
    const types = o.spec?.policyTypes ?? ["Ingress"];
    if (!types.includes("Ingress")) continue;
    const open = (o.spec?.ingress ?? []).filter((r) => admits(r) && !((r.from ?? []).length && r.from.every(fromGateway)));
    if (open.length) fails.push(`${at}: an ingress rule admits the peer port ${port} from ${open.map((r) => (r.from?.length ? JSON.stringify(r.from) : "anywhere")).join(", ")}, not the gateway's pods only`);
    else if (!(o.spec?.ingress ?? []).some(admits)) fails.push(`${at}: no ingress rule admits the peer port ${port}: the replicas cannot pull each other`);
    else oks.push(`${at}: the peer port ${port} from the gateway's own pods only`);
  }
  if (!oks.length && !fails.length) oks.push(`${who}: no NetworkPolicy selects the gateway's pods (the peer port is then open to the cluster's pods)`);
  return [oks, fails];
}

// The ports a listener (or the value a patch merges into one) adds as additional addresses.
export const additionalPorts = (v) => (v?.additional_addresses ?? [])
  .map((a) => Number(a?.address?.socket_address?.port_value)).filter((n) => !Number.isNaN(n));
