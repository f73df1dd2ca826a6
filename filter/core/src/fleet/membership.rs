//! The fleet's members, in *slots*: which pods the filter routes over.
//!
//! ```text
//! fixed list:  slot i = backends[i], for good
//! pool:        each tick the VM holding the scrape lease reads the pool
//!              clusters' endpoints from Envoy itself
//!                GET <admin_cluster> /clusters?format=json&filter=^(<c1>|<c2>…)$
//!              and assigns slots:
//!                a pod still listed keeps its slot
//!                a pod no longer listed leaves it           (vacated_ms := now)
//!                a new pod takes the free slot vacated longest ago
//!              then publishes the table in shared data; every VM applies it at
//!              its own tick
//! ```
//! Why slots: everything the filter keeps per pod (index entries, in-flight
//! counts, health, per-pod stats) is indexed by slot, so a pod that stays keeps
//! all of it, and rendezvous order (over addresses) moves only a departed pod's
//! keys. A pod back on a new IP is a new member in a cleared slot: it starts
//! cold. Taking the slot vacated longest ago gives the requests still ending
//! on a departed pod time to release their in-flight share before another pod
//! inherits the slot; with no other free slot, the new pod inherits that
//! share at once (it drains as those requests end). Index events about the
//! slot's previous pod that a VM applies late are dropped by their time.
//!
//! | parameter | default | why |
//! |---|---|---|
//! | `pool.max_backends` | 64 | slots: a pool with more endpoints leaves the rest out (the first fill takes them in address order, later pods take slots as they free up), and the log says so; every per-pod structure is sized by it |
//! | `pool.empty_grace_ms` | 30 000 | answers that list no endpoint at all keep the last members this long: a control plane that restarts or a transient empty EDS push would otherwise empty every slot and lose the index; a pool really scaled to zero empties after it |
//!
//! Envoy's admin is the source because it holds exactly the set that
//! `override_host` routes to, kept current by EDS (Kubernetes, Istio, a file),
//! with no controller to run; `bench/membership` measured the call at 0.5 ms
//! of Envoy's main thread and 52 KB for 64 pods, whatever else the gateway
//! holds. The `filter` parameter matches anywhere in a name, so the names are
//! escaped and anchored. Several clusters (one per model, typically) share
//! the slots; each pod keeps its cluster, which says what it serves.
//!
//! `filter` is Envoy 1.38's (envoyproxy/envoy#43407). An older Envoy ignores
//! it and lists every cluster: the reply is still read, the pool's clusters
//! alone (the others' hosts are skipped unparsed), within the same bound,
//! [`MAX_REPLY_BYTES`], and the log says so once. A gateway with a few
//! dozen clusters stays well inside it; one with hundreds (3.5 MB at 500
//! clusters, `bench/membership`) needs Envoy 1.38 or a fixed backend list.
//! The cost, at the tick of the VM holding the lease: parsing 1 MB (358
//! clusters, the pool's 64 pods among them) took 1.2 ms natively against
//! 70 µs for the filtered 21 KB (2,000 parses each, one run), and Envoy's
//! admin spends ~36 ms of its main thread listing 500 clusters.
//!
//! A reply naming none of the pool's clusters (or one twice), larger than
//! [`MAX_REPLY_BYTES`] or that does not parse changes nothing: a broken read
//! never empties the fleet. A cluster that loses some endpoints loses those
//! members; answers that list none at all change nothing for
//! `pool.empty_grace_ms`, then empty every slot. Endpoints Envoy would
//! not route to (unhealthy, draining, failing its outlier or active checks,
//! pending removal) stay members, so a blip keeps their slot and cache
//! picture, but are out of rotation.

use serde::Deserialize;
use serde_json::value::RawValue;
use std::borrow::Cow;

use crate::codec::{put, Reader};

/// Largest admin reply read (64 pods take ~52 KB; every cluster of a big gateway, MBs).
pub const MAX_REPLY_BYTES: usize = 1 << 20;

/// One endpoint of the pool as Envoy lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolEndpoint {
    /// `ip:port` (IPv6 in brackets), as `override_host` takes it.
    pub address: String,
    /// Whether Envoy would route to it.
    pub routable: bool,
    /// Which of the pool's clusters it is in.
    pub cluster: u16,
}

/// Why an admin reply was not used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplyError {
    /// Not JSON of the expected shape.
    Malformed,
    /// Larger than [`MAX_REPLY_BYTES`].
    TooLarge,
    /// Another cluster than the pool's, or one of them twice.
    WrongClusters,
}

/// The admin path that lists the endpoints of `clusters`.
pub fn admin_path(clusters: &[&str]) -> String {
    let mut regex = String::from(if clusters.len() > 1 { "^(" } else { "^" });
    for (i, cluster) in clusters.iter().enumerate() {
        if i > 0 {
            regex.push('|');
        }
        for c in cluster.chars() {
            if "\\.+*?()|[]{}^$".contains(c) {
                regex.push('\\');
            }
            regex.push(c);
        }
    }
    regex.push_str(if clusters.len() > 1 { ")$" } else { "$" });
    let mut path = String::from("/clusters?format=json&filter=");
    for b in regex.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            path.push(b as char);
        } else {
            path.push_str(&format!("%{b:02X}"));
        }
    }
    path
}

#[derive(Deserialize)]
struct Reply<'a> {
    #[serde(borrow, default)]
    cluster_statuses: Vec<ClusterStatus<'a>>,
}

#[derive(Deserialize)]
struct ClusterStatus<'a> {
    #[serde(borrow)]
    name: Cow<'a, str>,
    /// Read only for the pool's clusters: an Envoy that ignores `filter`
    /// lists every cluster, whose hosts are skipped unparsed.
    #[serde(borrow, default)]
    host_statuses: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct HostStatus<'a> {
    #[serde(borrow)]
    address: Address<'a>,
    #[serde(borrow, default)]
    health_status: HealthFlags<'a>,
}

#[derive(Deserialize)]
struct Address<'a> {
    #[serde(borrow)]
    socket_address: Option<SocketAddress<'a>>,
}

#[derive(Deserialize)]
struct SocketAddress<'a> {
    #[serde(borrow)]
    address: Cow<'a, str>,
    #[serde(default)]
    port_value: u32,
}

#[derive(Deserialize, Default)]
struct HealthFlags<'a> {
    #[serde(borrow, default)]
    eds_health_status: Option<Cow<'a, str>>,
    #[serde(default)]
    failed_outlier_check: bool,
    #[serde(default)]
    failed_active_health_check: bool,
    #[serde(default)]
    pending_dynamic_removal: bool,
}

impl HealthFlags<'_> {
    fn routable(&self) -> bool {
        // What override_host accepts by default: UNKNOWN (shown as HEALTHY), HEALTHY, DEGRADED.
        let status = self.eds_health_status.as_deref().unwrap_or("HEALTHY");
        matches!(status, "HEALTHY" | "DEGRADED" | "UNKNOWN")
            && !self.failed_outlier_check
            && !self.failed_active_health_check
            && !self.pending_dynamic_removal
    }
}

/// The pool's endpoints from an admin `/clusters?format=json` reply, sorted
/// by address (a pod listed in two clusters counts in the first), and how
/// many other clusters the reply listed (an Envoy older than 1.38 ignores
/// `filter` and lists them all; their hosts are skipped unread). A cluster of
/// the pool the reply leaves out has no endpoints; a reply with none of them
/// is [`ReplyError::WrongClusters`].
pub fn parse_endpoints(
    body: &[u8],
    clusters: &[&str],
) -> Result<(Vec<PoolEndpoint>, usize), ReplyError> {
    if body.len() > MAX_REPLY_BYTES {
        return Err(ReplyError::TooLarge);
    }
    let reply: Reply<'_> = serde_json::from_slice(body).map_err(|_| ReplyError::Malformed)?;
    let mut seen = vec![false; clusters.len()];
    let mut out: Vec<PoolEndpoint> = Vec::new();
    let mut others = 0;
    for status in &reply.cluster_statuses {
        let Some(i) = clusters.iter().position(|c| *c == status.name) else {
            others += 1;
            continue;
        };
        if std::mem::replace(&mut seen[i], true) {
            return Err(ReplyError::WrongClusters);
        }
        let hosts: Vec<HostStatus<'_>> = match status.host_statuses {
            Some(raw) => serde_json::from_str(raw.get()).map_err(|_| ReplyError::Malformed)?,
            None => Vec::new(),
        };
        out.extend(endpoints_of(&hosts, i as u16));
    }
    if !seen.iter().any(|&s| s) {
        // `{}`, or only other clusters: none of the pool's exists (yet); an empty
        // fleet would drop every pod.
        return Err(ReplyError::WrongClusters);
    }
    out.sort_by(|a, b| a.address.cmp(&b.address).then(a.cluster.cmp(&b.cluster)));
    out.dedup_by(|a, b| a.address == b.address);
    Ok((out, others))
}

fn endpoints_of<'s>(
    hosts: &'s [HostStatus<'_>],
    cluster: u16,
) -> impl Iterator<Item = PoolEndpoint> + 's {
    hosts.iter().filter_map(move |h| {
        let sa = h.address.socket_address.as_ref()?;
        let ip = sa.address.as_ref();
        let address = if ip.contains(':') {
            format!("[{ip}]:{}", sa.port_value)
        } else {
            format!("{ip}:{}", sa.port_value)
        };
        Some(PoolEndpoint {
            address,
            routable: h.health_status.routable(),
            cluster,
        })
    })
}

/// One pod in a slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// `ip:port`.
    pub address: String,
    /// Whether Envoy would route to it.
    pub routable: bool,
    /// Which of the pool's clusters it is in (0 for a fixed list).
    pub cluster: u16,
}

/// The slot table every VM shares.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Slots {
    /// Who holds each slot.
    pub members: Vec<Option<Member>>,
    /// When each empty slot was vacated (0: never held).
    vacated_ms: Vec<u64>,
    /// When each slot's pod joined (0: from the start).
    joined_ms: Vec<u64>,
}

/// What one assignment changed.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Changes {
    /// Slots a new pod took, with its address.
    pub joined: Vec<(usize, String)>,
    /// Slots a pod left, with its address.
    pub left: Vec<(usize, String)>,
    /// Endpoints left out for want of a free slot.
    pub unplaced: usize,
    /// Other clusters the reply listed (an Envoy that ignores `filter`).
    pub other_clusters: usize,
}

impl Changes {
    /// Whether membership (not only routability) changed.
    pub fn moved(&self) -> bool {
        !self.joined.is_empty() || !self.left.is_empty()
    }
}

impl Slots {
    /// `n` empty slots.
    pub fn empty(n: usize) -> Slots {
        Slots {
            members: vec![None; n],
            vacated_ms: vec![0; n],
            joined_ms: vec![0; n],
        }
    }

    /// A fixed fleet: slot i holds `addresses[i]`, routable.
    pub fn fixed<'a>(addresses: impl Iterator<Item = &'a str>) -> Slots {
        let members: Vec<Option<Member>> = addresses
            .map(|a| {
                Some(Member {
                    address: a.to_string(),
                    routable: true,
                    cluster: 0,
                })
            })
            .collect();
        let n = members.len();
        Slots {
            members,
            vacated_ms: vec![0; n],
            joined_ms: vec![0; n],
        }
    }

    /// Makes the table hold `endpoints` (sorted by address), keeping every
    /// pod that stays in its slot (see the module doc).
    pub fn assign(&mut self, endpoints: &[PoolEndpoint], now_ms: u64) -> Changes {
        let mut changes = Changes::default();
        let listed = |a: &str| {
            endpoints
                .binary_search_by(|e| e.address.as_str().cmp(a))
                .ok()
        };
        for (slot, m) in self.members.iter_mut().enumerate() {
            let Some(member) = m else { continue };
            match listed(&member.address).filter(|&i| endpoints[i].cluster == member.cluster) {
                Some(i) => member.routable = endpoints[i].routable,
                None => {
                    changes.left.push((slot, member.address.clone()));
                    *m = None;
                    if let Some(v) = self.vacated_ms.get_mut(slot) {
                        *v = now_ms.max(1);
                    }
                }
            }
        }
        for e in endpoints {
            if self.position(&e.address).is_some() {
                continue;
            }
            // The free slot vacated longest ago (never-held slots first).
            let free = (0..self.members.len())
                .filter(|&s| self.members[s].is_none())
                .min_by_key(|&s| (self.vacated_ms.get(s).copied().unwrap_or(0), s));
            match free {
                Some(s) => {
                    self.members[s] = Some(Member {
                        address: e.address.clone(),
                        routable: e.routable,
                        cluster: e.cluster,
                    });
                    if let Some(j) = self.joined_ms.get_mut(s) {
                        *j = now_ms.max(1);
                    }
                    changes.joined.push((s, e.address.clone()));
                }
                None => changes.unplaced += 1,
            }
        }
        changes
    }

    /// When slot `b`'s pod joined (0: from the start): index events older
    /// than that were about its previous pod.
    pub fn joined_ms(&self, b: usize) -> u64 {
        self.joined_ms.get(b).copied().unwrap_or(0)
    }

    /// The slot holding `address`.
    pub fn position(&self, address: &str) -> Option<usize> {
        self.members
            .iter()
            .position(|m| m.as_ref().is_some_and(|m| m.address == address))
    }

    /// The table as shared data: per slot, when it was vacated and when its
    /// pod joined, whether that pod is routable, its cluster, and its address
    /// (empty: no pod).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        put(&mut out, self.members.len() as u32);
        for ((m, &v), &j) in self
            .members
            .iter()
            .zip(&self.vacated_ms)
            .zip(&self.joined_ms)
        {
            put(&mut out, v);
            put(&mut out, j);
            put(&mut out, m.as_ref().is_some_and(|m| m.routable) as u8);
            put(&mut out, m.as_ref().map_or(0, |m| m.cluster));
            let a = m.as_ref().map_or("", |m| m.address.as_str());
            put(&mut out, a.len() as u16);
            out.extend_from_slice(a.as_bytes());
        }
        out
    }

    /// Decodes a table of `n` slots; another size or a damaged record is `None`.
    pub fn decode(bytes: &[u8], n: usize) -> Option<Slots> {
        let mut r = Reader::new(bytes);
        if r.get::<u32>()? as usize != n {
            return None;
        }
        let mut s = Slots::empty(n);
        for slot in 0..n {
            s.vacated_ms[slot] = r.get()?;
            s.joined_ms[slot] = r.get()?;
            let routable = r.get::<u8>()? == 1;
            let cluster = r.get::<u16>()?;
            let len = r.get::<u16>()? as usize;
            let address = std::str::from_utf8(r.take(len)?).ok()?;
            if !address.is_empty() {
                s.members[slot] = Some(Member {
                    address: address.to_string(),
                    routable,
                    cluster,
                });
            }
        }
        r.is_empty().then_some(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    /// One cluster's entry in an admin reply.
    fn status(cluster: &str, hosts: &[(&str, &str)]) -> String {
        let hosts: Vec<String> = hosts
            .iter()
            .map(|(a, status)| {
                let (ip, port) = a.rsplit_once(':').unwrap();
                format!(
                    r#"{{"address":{{"socket_address":{{"address":"{ip}","port_value":{port}}}}},"stats":[{{"name":"cx_connect_fail"}}],"health_status":{{"eds_health_status":"{status}"}},"weight":1}}"#
                )
            })
            .collect();
        format!(
            r#"{{"name":"{cluster}","added_via_api":true,"host_statuses":[{}]}}"#,
            hosts.join(",")
        )
    }

    fn reply(cluster: &str, hosts: &[(&str, &str)]) -> Vec<u8> {
        format!(r#"{{"cluster_statuses":[{}]}}"#, status(cluster, hosts)).into_bytes()
    }

    fn eps(addrs: &[&str]) -> Vec<PoolEndpoint> {
        let mut v: Vec<PoolEndpoint> = addrs
            .iter()
            .map(|a| PoolEndpoint {
                address: a.to_string(),
                routable: true,
                cluster: 0,
            })
            .collect();
        v.sort_by(|a, b| a.address.cmp(&b.address));
        v
    }

    fn held(s: &Slots) -> Vec<Option<&str>> {
        s.members
            .iter()
            .map(|m| m.as_ref().map(|m| m.address.as_str()))
            .collect()
    }

    #[test]
    fn the_admin_path_anchors_and_escapes_the_cluster_name() {
        assert_eq!(
            admin_path(&["outbound|8000||vllm.llm.svc.cluster.local"]),
            "/clusters?format=json&filter=%5Eoutbound%5C%7C8000%5C%7C%5C%7Cvllm%5C.llm%5C.svc%5C.cluster%5C.local%24"
        );
        assert_eq!(
            admin_path(&["pool"]),
            "/clusters?format=json&filter=%5Epool%24"
        );
    }

    #[test]
    fn endpoints_are_read_with_what_envoy_would_route_to() {
        let body = reply(
            "pool",
            &[
                ("10.0.0.2:8000", "HEALTHY"),
                ("10.0.0.1:8000", "DRAINING"),
                ("10.0.0.3:8000", "DEGRADED"),
            ],
        );
        let (got, _) = parse_endpoints(&body, &["pool"]).unwrap();
        let view: Vec<(&str, bool)> = got
            .iter()
            .map(|e| (e.address.as_str(), e.routable))
            .collect();
        assert_eq!(
            view,
            vec![
                ("10.0.0.1:8000", false),
                ("10.0.0.2:8000", true),
                ("10.0.0.3:8000", true)
            ]
        );
        let flagged = br#"{"cluster_statuses":[{"name":"pool","host_statuses":[
            {"address":{"socket_address":{"address":"::1","port_value":8000}},
             "health_status":{"eds_health_status":"HEALTHY","failed_outlier_check":true}}]}]}"#;
        let (got, _) = parse_endpoints(flagged, &["pool"]).unwrap();
        assert_eq!(
            (got[0].address.as_str(), got[0].routable),
            ("[::1]:8000", false)
        );
        // A cluster without endpoints has none.
        let bare = br#"{"cluster_statuses":[{"name":"pool"}]}"#;
        assert_eq!(parse_endpoints(bare, &["pool"]), Ok((vec![], 0)));
    }

    #[test]
    fn an_envoy_that_ignores_the_filter_is_read_for_the_pools_clusters_alone() {
        // Envoy before 1.38 lists every cluster: the pool's are read, the others skipped.
        let body = format!(
            r#"{{"cluster_statuses":[{},{},{}]}}"#,
            status("pool-metrics", &[("10.0.0.7:8000", "HEALTHY")]),
            status("pool", &[("10.0.0.1:8000", "HEALTHY")]),
            r#"{"name":"envoy-admin","host_statuses":[{"broken": true}]}"#,
        );
        let (got, others) = parse_endpoints(body.as_bytes(), &["pool"]).unwrap();
        assert_eq!(
            got.iter().map(|e| e.address.as_str()).collect::<Vec<_>>(),
            ["10.0.0.1:8000"]
        );
        assert_eq!(others, 2);
    }

    #[test]
    fn a_reply_that_is_not_the_pools_changes_nothing() {
        let twice = br#"{"cluster_statuses":[{"name":"pool"},{"name":"pool"}]}"#;
        let others = br#"{"cluster_statuses":[{"name":"pool-metrics"},{"name":"admin"}]}"#;
        for (body, want) in [
            (&b"{}"[..], ReplyError::WrongClusters),
            (&twice[..], ReplyError::WrongClusters),
            (&others[..], ReplyError::WrongClusters),
            (
                &reply("other", &[("10.0.0.1:1", "HEALTHY")])[..],
                ReplyError::WrongClusters,
            ),
            (&b"{\"cluster_statuses\":[{"[..], ReplyError::Malformed),
            (&b"not json"[..], ReplyError::Malformed),
        ] {
            assert_eq!(parse_endpoints(body, &["pool"]), Err(want));
        }
        let huge = vec![b' '; MAX_REPLY_BYTES + 1];
        assert_eq!(parse_endpoints(&huge, &["pool"]), Err(ReplyError::TooLarge));
    }

    #[test]
    fn several_clusters_are_read_at_once_and_each_pod_keeps_its_cluster() {
        assert_eq!(
            admin_path(&["llama", "qwen.x"]),
            "/clusters?format=json&filter=%5E%28llama%7Cqwen%5C.x%29%24"
        );
        let body = format!(
            r#"{{"cluster_statuses":[{},{}]}}"#,
            status("qwen.x", &[("10.0.0.9:8000", "HEALTHY")]),
            status("llama", &[("10.0.0.1:8000", "HEALTHY")]),
        );
        let (got, _) = parse_endpoints(body.as_bytes(), &["llama", "qwen.x"]).unwrap();
        let view: Vec<(&str, u16)> = got
            .iter()
            .map(|e| (e.address.as_str(), e.cluster))
            .collect();
        assert_eq!(view, vec![("10.0.0.1:8000", 0), ("10.0.0.9:8000", 1)]);
        // One cluster absent: its pods are gone, the other's stay.
        let one = reply("llama", &[("10.0.0.1:8000", "HEALTHY")]);
        assert_eq!(
            parse_endpoints(&one, &["llama", "qwen.x"]).unwrap().0.len(),
            1
        );
        // A pod that moved to another cluster is a new member.
        let mut s = Slots::empty(2);
        s.assign(&got, 1);
        let moved = vec![PoolEndpoint {
            address: "10.0.0.1:8000".into(),
            routable: true,
            cluster: 1,
        }];
        let c = s.assign(&moved, 2);
        assert_eq!((c.left.len(), c.joined.len()), (2, 1));
        assert_eq!(
            s.members
                .iter()
                .flatten()
                .map(|m| m.cluster)
                .collect::<Vec<_>>(),
            vec![1]
        );
    }

    #[test]
    fn pods_that_stay_keep_their_slots_and_new_ones_take_the_oldest_free_slot() {
        let mut s = Slots::empty(4);
        let c = s.assign(&eps(&["a:1", "b:1", "c:1"]), 10);
        assert_eq!(c.joined.len(), 3);
        assert_eq!(held(&s), vec![Some("a:1"), Some("b:1"), Some("c:1"), None]);
        // b leaves at 20, a at 30; d and e join later: d takes the never-held slot,
        // e the one vacated longest ago (b's), and a's slot waits.
        let c = s.assign(&eps(&["a:1", "c:1"]), 20);
        assert_eq!(c.left, vec![(1, "b:1".to_string())]);
        s.assign(&eps(&["c:1"]), 30);
        let c = s.assign(&eps(&["c:1", "d:1", "e:1"]), 40);
        assert_eq!(
            c.joined,
            vec![(3, "d:1".to_string()), (1, "e:1".to_string())]
        );
        assert_eq!(held(&s), vec![None, Some("e:1"), Some("c:1"), Some("d:1")]);
        // A full table leaves the rest out, and says how many.
        let c = s.assign(&eps(&["c:1", "d:1", "e:1", "f:1", "g:1"]), 50);
        assert_eq!((c.joined.len(), c.unplaced), (1, 1));
        assert!(!s
            .assign(&eps(&["c:1", "d:1", "e:1", "f:1", "g:1"]), 60)
            .moved());
    }

    #[test]
    fn the_table_round_trips_and_rejects_other_shapes() {
        let mut s = Slots::empty(3);
        s.assign(&eps(&["10.0.0.1:8000", "[::1]:8000"]), 5);
        s.assign(&eps(&["[::1]:8000"]), 7);
        let bytes = s.encode();
        assert_eq!(Slots::decode(&bytes, 3), Some(s.clone()));
        assert_eq!(Slots::decode(&bytes, 4), None);
        assert_eq!(Slots::decode(&bytes[..bytes.len() - 1], 3), None);
        assert_eq!(Slots::decode(&[], 3), None);
    }

    #[test]
    fn the_record_keeps_its_layout() {
        let mut s = Slots::empty(3);
        s.assign(&eps(&["10.0.0.1:8000", "10.0.0.2:8000"]), 10);
        s.assign(&eps(&["10.0.0.2:8000"]), 20);
        assert_eq!(crate::testing::hex(&s.encode()), "0300000014000000000000000a00000000000000000000000000000000000000000a000000000000000100000d0031302e302e302e323a38303030000000000000000000000000000000000000000000", "members.v1");
    }
}
