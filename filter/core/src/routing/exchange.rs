//! The exchange between gateway replicas: each replica serves the index
//! events its own VMs appended, and pulls every peer's into its own log
//! ([`crate::routing::index_log`]), so a conversation whose turns a load
//! balancer spreads over several gateways still finds the pod that holds it.
//!
//! ```text
//! serve(since)  = the serving worker's outbox (its replica's own events, origin not IMPORTED,
//!                 up to the log head it applied) from max(since, oldest kept), in order,
//!                 while the events stay within min(asked, max_reply_bytes) − room (the first
//!                 event exempt, so a cursor always moves; room = min(ANSWERS_ROOM, that / 2)
//!                 when answers are asked for, else 0; loads beside the ask); each as
//!                 (kind, pod address, age = now − time_e, len, kept hashes);
//!                 with the replica's own in-flight work per pod (every ledger share but IMPORTED's)
//! pull(peer)    = every tick (`metrics.period_ms`), from the VM holding the scrape lease,
//!                 one request per peer, since the peer's last `next` (first contact: since 0,
//!                 all its outbox: a joining replica copies it)
//! import(event) = pod address → this replica's slot (unknown pod: dropped);
//!                 time = max(now − age, slot joined);  of origin IMPORTED, packed many to a log
//!                 slot ([`crate::routing::index_log`])
//! ring share    = per pull: slots_p = max(3, slots / (2 × peers)) of the log, reply asked
//!                 `bytes=` slots_p × slot_bytes / 3 (a packed event takes at most 44/15 ≈ 2.9×
//!                 its bytes in the reply: an eviction's); the peer cuts its reply there, the rest comes next tick
//! import(loads) = Σ over peers answered within a lease, per pod → the ledger share of IMPORTED
//! answers       = asked with `answers=M` by an Envoy that keeps stored responses: the serving
//!                 Envoy's stored responses' answers numbered M on
//!                 ([`crate::fleet::responses::Recent`]), each (id, pod address id, age);
//!                 imported into this Envoy's record, at = now − age
//! ```
//! | parameter | default | why |
//! |---|---|---|
//! | `peers.cluster` | none (required) | the Envoy cluster of the gateway's replicas' peer listeners, reached by `override_host` as the pods are |
//! | `peers.port` | none (required) | the peer listener's port: only a request arriving on it is answered with events; the client listeners never are, so no client reads which prefixes are warm where |
//! | `peers.admin_cluster` | `envoy-admin` | Envoy's admin, to read the peers cluster's endpoints (EDS or DNS keeps them current) |
//! | `peers.timeout_ms` | 500 | a slow peer costs one callout slot for this long, never a request |
//! | `peers.max_reply_bytes` | 1 MiB | a reply past it is not read (a lying or broken peer); a serving replica cuts its reply to fit |
//! | [`MEMBERS_EVERY_MS`] | 2000 | the peers cluster's endpoints read this often: a replica that joins is pulled, and pulls, within about 2 s plus a tick |
//! | ring share | half the log's slots per tick, over the peers | imported events reach every VM through the shared log's ring, which a VM reads at its requests and at least once a tick: a tick's imports past the ring lap it, and a VM keeps only the last `slots` (a joining replica's copy of a peer's outbox would come down to its last 64 events). Packed ~100 conversation events to a slot, a copy of 300 events takes 3 slots; a full 1 MiB outbox at 3 replicas ~12 ticks |
//! | `peers.outbox_bytes` | 1 MiB | per worker: thousands of recent placements, where the shared log's ring (64 events by default) laps within a second at a busy gateway's rate |
//!
//! **Why pull, through Envoy.** A gateway replica needs nothing beside the
//! gateways: peers are found by Envoy's own discovery, reached by Envoy's
//! callouts, and served by the filter on a port of their own. Pulling at
//! the tick never touches a request: a dead peer is a failed callout, a
//! slow one a timed-out one, and a reply that does not decode (another
//! version, garbage, an over-long count) is dropped whole.
//!
//! **Pods by address.** Each replica numbers its pods in its own slot table,
//! so events travel with the pod's address, and an event about a pod this
//! replica does not have is dropped. **Time by age.** Replicas' clocks may
//! differ; an event travels with its age, which the importer takes from its
//! own clock (off by the transit time).
//!
//! **Growth with N replicas.** Every routed request's event is sent to each
//! of the N − 1 others: bytes per request ≈ (N − 1) × (33 + 8 × kept hashes),
//! kept hashes ≈ 100 for a 128 KB prompt ([`crate::routing::index::kept_positions`]);
//! each replica imports the fleet's whole event rate, which is what a single
//! gateway would apply itself, so its index and its CPU per fleet request do
//! not grow with N; its pulls per period do (N − 1 callouts). The loads
//! make each replica's gate and bounds weigh the others' requests one tick
//! late: a burst that reaches every replica within one tick still passes
//! the knee on each.
//!
//! A replica tells itself among the peers (its own endpoint is in the peers
//! cluster) by the replica id in the reply ([`Peers::answered`]).
//!
//! **Stored responses' answers** travel in a section of their own, sent only
//! to a puller that asks for it (`answers=M` in the query): a replica of an
//! earlier release neither asks nor sends one, and reads every reply it gets
//! as before, so replicas of both releases exchange events during a rollout.
//! The events leave room for a whole ring of answers ([`ANSWERS_ROOM`], at
//! most half the reply), so a catch-up reply that events fill still carries them.

use crate::codec::{put, Reader};
use crate::fleet::inflight::InFlight;
use crate::fleet::responses::RECENT;
use crate::fleet::store::LogShape;
use crate::routing::index::kept_positions;
use crate::routing::index_log::{Event, Kind};
use std::collections::VecDeque;

/// Path a replica serves its events on (version in the path).
pub const PEER_PATH: &str = "/warmroute/peer/v1/events";

const MAGIC: &[u8; 4] = b"wrpx";
const VERSION: u8 = 1;
const REPLY_HEADER: usize = 4 + 1 + 8 + 8 + 2 + 2 + 4;
const LOAD_BYTES: usize = 2 + 4 + 4 + 4;
const EVENT_HEADER: usize = 1 + 2 + 4 + 4 + 4;
const ANSWERS_HEADER: usize = 8 + 2;
const ANSWER_BYTES: usize = 8 + 8 + 4;
/// The answers section of a whole ring of recent answers.
pub const ANSWERS_ROOM: usize = ANSWERS_HEADER + RECENT * ANSWER_BYTES;
/// Longest pod address a reply may carry (an IPv6 address with port is ~47 bytes).
const MAX_ADDRESS_BYTES: usize = 255;

/// One event as it travels between replicas.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerEvent {
    /// What it says.
    pub kind: Kind,
    /// Index of its pod in [`Batch::pods`].
    pub pod: u16,
    /// Milliseconds between the event (a decision; an eviction's cut-off) and the reply.
    pub age_ms: u32,
    /// Length of the chain received (0 for an eviction).
    pub len: u32,
    /// The chain's hashes at [`kept_positions`] of `len`.
    pub blocks: Vec<u64>,
}

/// Who answered a stored response, as it travels between replicas
/// ([`crate::fleet::responses::Entry`], its time as an age).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerAnswer {
    /// The response's id, hashed.
    pub id: u64,
    /// The pod that answered it: its address id.
    pub pod: u64,
    /// Milliseconds between the answer and the reply.
    pub age_ms: u32,
}

/// The stored responses' answers a puller asked for.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Answers {
    /// The answer number to ask from next time.
    pub next: u64,
    /// The answers, oldest first.
    pub entries: Vec<PeerAnswer>,
}

/// A replica's reply: its events from the asked sequence number on.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Batch {
    /// The serving replica ([`Peers::answered`] tells itself by it).
    pub replica: u64,
    /// Where to ask from next time.
    pub next_seq: u64,
    /// The pods the events and loads name, by address.
    pub pods: Vec<String>,
    /// What the serving replica's own requests hold on each pod where that is
    /// something (index into `pods`): its share of the fleet's load, which the
    /// gate and the bounds weigh.
    pub loads: Vec<(u16, InFlight)>,
    /// The events, oldest first.
    pub events: Vec<PeerEvent>,
    /// The stored responses' answers, when the puller asked for them.
    pub answers: Option<Answers>,
}

/// Why a reply was not used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchError {
    /// Not a reply of this version (another release, or not a peer at all).
    Version,
    /// Truncated, an index out of range, an over-long field or trailing bytes.
    Malformed,
}

/// Builds a reply within a byte budget.
pub struct BatchWriter {
    batch: Batch,
    bytes: usize,
    max_bytes: usize,
    /// The size the puller asked for: past it no event is added but the first.
    asked: usize,
}

impl BatchWriter {
    /// An empty reply of `replica`; `next_seq` is where the peer asked from.
    pub fn new(replica: u64, since: u64, max_bytes: usize) -> BatchWriter {
        BatchWriter {
            batch: Batch {
                replica,
                next_seq: since,
                ..Batch::default()
            },
            bytes: REPLY_HEADER,
            max_bytes,
            asked: max_bytes,
        }
    }

    /// Keeps the reply within `bytes` (the puller's ask), but for its first
    /// event, which fits within the writer's own limit: a cursor always moves.
    pub fn asked(mut self, bytes: usize) -> BatchWriter {
        self.asked = bytes.min(self.max_bytes);
        self
    }

    /// The index of the pod at `address` in the reply's table, adding it if
    /// `cost` more bytes (and its entry) fit; `None`: they do not.
    fn pod(&mut self, address: &str, cost: usize) -> Option<u16> {
        let known = self.batch.pods.iter().position(|p| p == address);
        let entry = if known.is_some() {
            0
        } else {
            1 + address.len()
        };
        let limit = if self.batch.events.is_empty() {
            self.max_bytes
        } else {
            self.asked
        };
        if address.len() > MAX_ADDRESS_BYTES
            || self.bytes + cost + entry > limit
            || (known.is_none() && self.batch.pods.len() >= usize::from(u16::MAX))
        {
            return None;
        }
        self.bytes += cost + entry;
        let i = known.unwrap_or_else(|| {
            self.batch.pods.push(address.to_owned());
            self.batch.pods.len() - 1
        });
        Some(i as u16)
    }

    /// Adds what this replica's requests hold on the pod at `address`; false if it does not fit.
    /// Loads are never written to the puller's log, so they leave its ask to the events.
    pub fn load(&mut self, address: &str, held: InFlight) -> bool {
        if self.batch.loads.len() >= usize::from(u16::MAX) {
            return false;
        }
        let before = self.bytes;
        let Some(pod) = self.pod(address, LOAD_BYTES) else {
            return false;
        };
        self.asked = (self.asked + (self.bytes - before)).min(self.max_bytes);
        self.batch.loads.push((pod, held));
        true
    }

    /// Adds event `seq` about the pod at `address`; false (and nothing added)
    /// once the reply is full: the peer asks from `seq` next time.
    pub fn push(&mut self, seq: u64, address: &str, event: PeerEventRef<'_>) -> bool {
        if self.batch.events.len() >= usize::from(u16::MAX) {
            return false;
        }
        let Some(pod) = self.pod(address, EVENT_HEADER + 8 * event.blocks.len()) else {
            return false;
        };
        self.batch.events.push(PeerEvent {
            kind: event.kind,
            pod,
            age_ms: event.age_ms,
            len: event.len,
            blocks: event.blocks.to_vec(),
        });
        self.batch.next_seq = seq + 1;
        true
    }

    /// Opens the answers section (the puller asked from answer `since`);
    /// false if not even its header fits.
    pub fn open_answers(&mut self, since: u64) -> bool {
        if self.bytes + ANSWERS_HEADER > self.asked {
            return false;
        }
        self.bytes += ANSWERS_HEADER;
        self.batch.answers = Some(Answers {
            next: since,
            entries: Vec::new(),
        });
        true
    }

    /// Adds answer number `n`; false (and nothing added) once the reply is
    /// full or no section is open: the puller asks from `n` next time.
    pub fn answer(&mut self, n: u64, a: PeerAnswer) -> bool {
        let fits = self.bytes + ANSWER_BYTES <= self.asked;
        let Some(answers) = self
            .batch
            .answers
            .as_mut()
            .filter(|s| fits && s.entries.len() < usize::from(u16::MAX))
        else {
            return false;
        };
        self.bytes += ANSWER_BYTES;
        answers.entries.push(a);
        answers.next = n + 1;
        true
    }

    /// Lets what is added next use up to `max_bytes`, within the puller's
    /// ask `asked`: the room kept for the answers section while the events
    /// filled the rest.
    pub fn widen(&mut self, max_bytes: usize, asked: usize) {
        self.max_bytes = self.max_bytes.max(max_bytes);
        self.asked = self.asked.max(asked.min(self.max_bytes));
    }

    /// Every answer before `n` is served: ask from `n` next.
    pub fn answers_to(&mut self, n: u64) {
        if let Some(a) = &mut self.batch.answers {
            a.next = a.next.max(n);
        }
    }

    /// Everything before `seq` is served or not for peers: ask from `seq` next.
    pub fn skip_to(&mut self, seq: u64) {
        self.batch.next_seq = self.batch.next_seq.max(seq);
    }

    /// The reply's bytes.
    pub fn finish(self) -> Vec<u8> {
        self.batch.encode()
    }
}

/// An event to serve, borrowed from the log.
#[derive(Debug, Clone, Copy)]
pub struct PeerEventRef<'a> {
    /// What it says.
    pub kind: Kind,
    /// Its age at the reply.
    pub age_ms: u32,
    /// Length of the chain.
    pub len: u32,
    /// The kept hashes.
    pub blocks: &'a [u64],
}

impl Batch {
    /// `magic ‖ version u8 ‖ replica u64 ‖ next_seq u64 ‖ n_pods u16 ‖ n_pods × (len u8 ‖ address)
    /// ‖ n_loads u16 ‖ n_loads × (pod u16 ‖ requests u32 ‖ prefill_blocks u32 ‖ decode_tokens u32)
    /// ‖ n_events u32 ‖ n_events × (kind u8 ‖ pod u16 ‖ age_ms u32 ‖ len u32 ‖ n u32 ‖ n × u64)
    /// [‖ next u64 ‖ n_answers u16 ‖ n_answers × (id u64 ‖ pod u64 ‖ age_ms u32)]`, the last part
    /// only when the puller asked for answers.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(REPLY_HEADER);
        out.extend_from_slice(MAGIC);
        put(&mut out, VERSION);
        put(&mut out, self.replica);
        put(&mut out, self.next_seq);
        put(&mut out, self.pods.len() as u16);
        for p in &self.pods {
            put(&mut out, p.len() as u8);
            out.extend_from_slice(p.as_bytes());
        }
        put(&mut out, self.loads.len() as u16);
        for (pod, f) in &self.loads {
            put(&mut out, *pod);
            put(&mut out, f.requests);
            put(&mut out, f.prefill_blocks);
            put(&mut out, f.decode_tokens);
        }
        put(&mut out, self.events.len() as u32);
        for e in &self.events {
            put(&mut out, e.kind as u8);
            put(&mut out, e.pod);
            put(&mut out, e.age_ms);
            put(&mut out, e.len);
            put(&mut out, e.blocks.len() as u32);
            for &h in &e.blocks {
                put(&mut out, h);
            }
        }
        if let Some(a) = &self.answers {
            put(&mut out, a.next);
            put(&mut out, a.entries.len() as u16);
            for e in &a.entries {
                put(&mut out, e.id);
                put(&mut out, e.pod);
                put(&mut out, e.age_ms);
            }
        }
        out
    }

    /// Decodes a reply, checking every count against what follows and every
    /// chain against the positions its length keeps: what a lying peer sends
    /// is refused whole, never half-applied.
    pub fn decode(b: &[u8]) -> Result<Batch, BatchError> {
        let mut r = Reader::new(b);
        if r.take(4) != Some(MAGIC.as_slice()) || r.get::<u8>() != Some(VERSION) {
            return Err(BatchError::Version);
        }
        Self::decode_body(&mut r).ok_or(BatchError::Malformed)
    }

    fn decode_body(r: &mut Reader<'_>) -> Option<Batch> {
        let (replica, next_seq, n_pods) = (r.get()?, r.get()?, r.get::<u16>()?);
        let pods = (0..n_pods)
            .map(|_| {
                let len = usize::from(r.get::<u8>()?);
                let text = std::str::from_utf8(r.take(len)?).ok()?;
                (!text.is_empty()).then(|| text.to_owned())
            })
            .collect::<Option<Vec<String>>>()?;
        let n_loads = r.get::<u16>()?;
        let loads = (0..n_loads)
            .map(|_| {
                let pod = r.get::<u16>()?;
                let held = InFlight {
                    requests: r.get()?,
                    prefill_blocks: r.get()?,
                    decode_tokens: r.get()?,
                };
                (usize::from(pod) < pods.len()).then_some((pod, held))
            })
            .collect::<Option<Vec<(u16, InFlight)>>>()?;
        let n_events = r.get::<u32>()? as usize;
        // Each event takes at least its header: a count the bytes cannot hold is a lie.
        if n_events > r.rest().len() / EVENT_HEADER {
            return None;
        }
        let mut events = Vec::with_capacity(n_events);
        for _ in 0..n_events {
            let kind = match r.get::<u8>()? {
                0 => Kind::Received,
                1 => Kind::Evicted,
                _ => return None,
            };
            let (pod, age_ms, len, n) =
                (r.get::<u16>()?, r.get()?, r.get::<u32>()?, r.get::<u32>()?);
            let n = n as usize;
            let most = match kind {
                Kind::Received => kept_positions(len as usize).count(),
                Kind::Evicted => 0,
            };
            if usize::from(pod) >= pods.len() || n > most || n > r.rest().len() / 8 {
                return None;
            }
            let blocks = (0..n)
                .map(|_| r.get::<u64>())
                .collect::<Option<Vec<u64>>>()?;
            events.push(PeerEvent {
                kind,
                pod,
                age_ms,
                len,
                blocks,
            });
        }
        let answers = if r.is_empty() {
            None
        } else {
            let (next, n) = (r.get::<u64>()?, usize::from(r.get::<u16>()?));
            if r.rest().len() != n * ANSWER_BYTES {
                return None;
            }
            let entries = (0..n)
                .map(|_| {
                    Some(PeerAnswer {
                        id: r.get()?,
                        pod: r.get()?,
                        age_ms: r.get()?,
                    })
                })
                .collect::<Option<Vec<PeerAnswer>>>()?;
            Some(Answers { next, entries })
        };
        r.is_empty().then_some(Batch {
            replica,
            next_seq,
            pods,
            loads,
            events,
            answers,
        })
    }
}

/// This VM's copy of its replica's own recent events, for peers to pull:
/// the shared log's ring is sized for the VMs of one Envoy, which read it at
/// every request, and laps within a second at a busy gateway's rate; a peer
/// pulling every period, or joining, needs more history than that.
#[derive(Debug)]
pub struct Outbox {
    /// Events by sequence number, oldest first.
    events: VecDeque<Event>,
    bytes: usize,
    max_bytes: usize,
}

impl Outbox {
    /// An outbox of at most `max_bytes` of events.
    pub fn new(max_bytes: usize) -> Outbox {
        Outbox {
            events: VecDeque::new(),
            bytes: 0,
            max_bytes,
        }
    }

    fn cost(e: &Event) -> usize {
        EVENT_HEADER + 24 + 8 * e.blocks.len()
    }

    /// Keeps `e` (this replica's own, not an imported one), in sequence
    /// order, dropping the oldest past the budget.
    pub fn push(&mut self, e: Event) {
        self.bytes += Outbox::cost(&e);
        // Nearly always the newest: another VM's older event is found from the back.
        let at = self
            .events
            .iter()
            .rposition(|x| x.head.seq < e.head.seq)
            .map_or(0, |i| i + 1);
        self.events.insert(at, e);
        while self.bytes > self.max_bytes {
            match self.events.pop_front() {
                Some(old) => self.bytes -= Outbox::cost(&old),
                None => break,
            }
        }
    }

    /// The events from `since` (or the oldest kept) up to, not including, `until`.
    pub fn range(&self, since: u64, until: u64) -> impl Iterator<Item = &Event> {
        let from = self.events.partition_point(|e| e.head.seq < since);
        self.events
            .range(from..)
            .take_while(move |e| e.head.seq < until)
    }

    /// The oldest sequence number kept.
    pub fn oldest(&self) -> Option<u64> {
        self.events.front().map(|e| e.head.seq)
    }
}

/// The value of `key` (`key=value`) in `path`'s query, if it has one.
fn query_value<'a>(path: &'a str, key: &str) -> Option<&'a str> {
    let (_, query) = path.split_once('?')?;
    query
        .split('&')
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
}

/// The sequence number a peer asks from (`since=N` in the query; absent or
/// unreadable: 0, the whole ring).
pub fn since_of(path: &str) -> u64 {
    query_value(path, "since")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// The answer number a peer asks stored responses' answers from (`answers=M`
/// in the query); `None`: it does not ask (a replica of an earlier release).
pub fn answers_of(path: &str) -> Option<u64> {
    query_value(path, "answers").map(|v| v.parse().unwrap_or(0))
}

/// The reply size a peer asks for (`bytes=N` in the query); `None`: as the
/// serving replica's `peers.max_reply_bytes` allows (a replica of an earlier
/// release does not ask).
pub fn bytes_of(path: &str) -> Option<usize> {
    query_value(path, "bytes").and_then(|v| v.parse().ok())
}

/// What one pull may bring into a log of `shape` when `peers` are pulled each
/// tick: at most this many slots written, and the reply size to ask for.
pub fn ring_share(shape: LogShape, peers: usize) -> (usize, usize) {
    let slots = usize::try_from(shape.slots).unwrap_or(usize::MAX);
    let per_pull = (slots / (2 * peers.max(1))).max(MIN_SLOTS_PER_PULL);
    (per_pull, per_pull.saturating_mul(shape.slot_bytes) / 3)
}

/// The fewest slots one pull may write: a reply of a slot's bytes packs into them.
const MIN_SLOTS_PER_PULL: usize = 3;

/// Whether `path` asks for peer events (query string aside).
pub fn is_peer_path(path: &str) -> bool {
    path.split(['?', '#']).next() == Some(PEER_PATH)
}

/// One peer as this replica's puller sees it.
#[derive(Debug, Clone)]
struct Peer {
    address: String,
    /// The peer's replica id and where to ask from, once it answered.
    cursor: Option<(u64, u64)>,
    /// The pull under way: callout token and when it was sent.
    call: Option<(u32, u64)>,
    /// This replica itself (its own endpoint is in the peers cluster).
    me: bool,
    /// What the peer's own requests held per pod, by address, when it last answered.
    loads: Option<(u64, Vec<(String, InFlight)>)>,
    /// The answer number to ask the peer's stored responses' answers from.
    answers: u64,
}

/// The puller's state: the peers, their cursors and the pulls under way.
#[derive(Debug, Default)]
pub struct Peers {
    replica: u64,
    peers: Vec<Peer>,
    /// The read of the peers cluster's endpoints under way (token, sent).
    pub members_call: Option<(u32, u64)>,
    /// When that read last succeeded.
    pub members_read_ms: Option<u64>,
}

/// How often the puller reads the peers cluster's endpoints from Envoy's
/// admin: replicas come and go at a rollout's or an autoscaler's pace, and an
/// admin read costs Envoy about what a pull does, so reading it at every tick
/// would double the exchange's callouts for nothing.
pub const MEMBERS_EVERY_MS: u64 = 2_000;

/// What a pull's reply was.
#[derive(Debug, PartialEq, Eq)]
pub enum Pulled {
    /// Events to import.
    Events(Batch),
    /// The reply came from this replica itself: it is not pulled again.
    Me,
    /// Nothing usable (status, size, decoding).
    Failed,
}

impl Peers {
    /// The puller of replica `replica`.
    pub fn new(replica: u64) -> Peers {
        Peers {
            replica,
            ..Peers::default()
        }
    }

    /// The peers cluster's endpoints as Envoy lists them: cursors of the
    /// peers that stay are kept, a new one starts from its whole ring.
    pub fn set_members(&mut self, mut addresses: Vec<String>) {
        addresses.sort();
        addresses.dedup();
        let old = std::mem::take(&mut self.peers);
        self.peers = addresses
            .into_iter()
            .map(|address| {
                old.iter()
                    .find(|p| p.address == address)
                    .cloned()
                    .unwrap_or(Peer {
                        address,
                        cursor: None,
                        call: None,
                        me: false,
                        loads: None,
                        answers: 0,
                    })
            })
            .collect();
    }

    /// The peers to pull now, with the path to ask: every peer but this
    /// replica without a pull under way (one lost past `lost_after_ms` is
    /// given up). Stored responses' answers are asked for only when this
    /// Envoy keeps a record to put them in (`with_answers`).
    pub fn due(
        &mut self,
        now: u64,
        lost_after_ms: u64,
        bytes: usize,
        with_answers: bool,
    ) -> Vec<(String, String)> {
        let mut out = Vec::new();
        for p in &mut self.peers {
            if p.call
                .is_some_and(|(_, sent)| now.saturating_sub(sent) > lost_after_ms)
            {
                p.call = None;
            }
            if p.me || p.call.is_some() {
                continue;
            }
            let since = p.cursor.map_or(0, |(_, next)| next);
            let answers = match with_answers {
                true => format!("&answers={}", p.answers),
                false => String::new(),
            };
            out.push((
                p.address.clone(),
                format!("{PEER_PATH}?since={since}{answers}&bytes={bytes}"),
            ));
        }
        out
    }

    /// A pull to `address` was dispatched as `token`.
    pub fn dispatched(&mut self, address: &str, token: u32, now: u64) {
        if let Some(p) = self.peers.iter_mut().find(|p| p.address == address) {
            p.call = Some((token, now));
        }
    }

    /// Whether `token` is one of this puller's pulls.
    pub fn is_pull(&self, token: u32) -> bool {
        self.peers
            .iter()
            .any(|p| p.call.is_some_and(|(t, _)| t == token))
    }

    /// The reply to pull `token` at `now` (`body`: `None` when it failed): the
    /// batch to import, with the peer's cursor moved past it and its loads
    /// kept. A peer that restarted (another replica id) numbers its events
    /// and answers from 0 again: this reply may have skipped those below the
    /// old cursors, so the next pull asks for all it keeps (what comes twice
    /// is applied twice, which changes nothing).
    pub fn answered(&mut self, token: u32, body: Option<&[u8]>, now: u64) -> Pulled {
        let Some(p) = self
            .peers
            .iter_mut()
            .find(|p| p.call.is_some_and(|(t, _)| t == token))
        else {
            return Pulled::Failed;
        };
        p.call = None;
        let Some(batch) = body.and_then(|b| Batch::decode(b).ok()) else {
            return Pulled::Failed;
        };
        if batch.replica == self.replica {
            p.me = true;
            return Pulled::Me;
        }
        if p.cursor
            .is_some_and(|(replica, _)| replica != batch.replica)
        {
            p.cursor = Some((batch.replica, 0));
            p.answers = 0;
        } else {
            p.cursor = Some((batch.replica, batch.next_seq));
            if let Some(a) = &batch.answers {
                p.answers = a.next;
            }
        }
        let loads = batch
            .loads
            .iter()
            .filter_map(|&(pod, held)| Some((batch.pods.get(usize::from(pod))?.clone(), held)))
            .collect();
        p.loads = Some((now, loads));
        Pulled::Events(batch)
    }

    /// What the peers' own requests hold, per pod address, summed over the
    /// peers that answered within `max_age_ms` (a dead peer's load lapses).
    pub fn loads(&self, now: u64, max_age_ms: u64) -> Vec<(String, InFlight)> {
        let mut out: Vec<(String, InFlight)> = Vec::new();
        let fresh = self.peers.iter().filter_map(|p| match &p.loads {
            Some((at, loads)) if now.saturating_sub(*at) <= max_age_ms => Some(loads),
            _ => None,
        });
        for (address, held) in fresh.flatten() {
            match out.iter_mut().find(|(a, _)| a == address) {
                Some((_, sum)) => sum.add(held),
                None => out.push((address.clone(), *held)),
            }
        }
        out
    }

    /// How many peers are pulled (this replica left out).
    pub fn count(&self) -> usize {
        self.peers.iter().filter(|p| !p.me).count()
    }
}

#[cfg(test)]
mod tests;
