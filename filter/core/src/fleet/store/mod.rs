//! Fleet state every worker VM shares through proxy-wasm shared data.
//!
//! Each value lives under `warmroute.<fleet>.<name>`, where `<fleet>` hashes
//! the backend addresses (or a discovered pool's clusters and slot count),
//! the block size and the log's size: a reconfigured fleet never reads
//! another fleet's bytes. Two records are this Envoy's rather than a
//! fleet's: the fleets registry (below) and the pods that answered stored
//! responses (`warmroute.responses.v1.<bucket>`, [`crate::fleet::responses`]),
//! whose entries name pods by address and outlive a reconfiguration. Updates are read-modify-write with
//! CAS, retried a bounded number of times (a worker that keeps losing gives up
//! and counts it rather than spin).
//!
//! ## Fleets that are gone
//! Shared data lives as long as Envoy, so every reconfiguration to another
//! backend list would strand its predecessor's keys (the index log alone is
//! `index.log_bytes`). Every VM heartbeats its fleet in one registry value,
//! `warmroute.fleets.v1`, at its tick, with how long it may stay silent:
//! [`FLEET_IDLE_MS`], or ten of its own leases if longer (a fleet's ticks may
//! be far apart). One silent for longer is swept by the next tick of any
//! other: each of its values is emptied and its entry dropped. Envoy has no
//! delete, so the key names stay, a few bytes each.
//!
//! The value every routed request updates is the *ledger*
//! ([`ledger`]): in-flight work per VM and the index log's head, one CAS.

use crate::codec::{self, put, Reader};
use crate::fleet::health::{decode_health, encode_health, Health};
use crate::fleet::inflight::{apply_sparse, Delta, InFlight, Sparse};
use crate::fleet::lora::{decode_lora, encode_lora, Lora};
use crate::fleet::membership::Slots;
use crate::fleet::responses::{self, Entry};
use crate::host::{Host, HostError, Versioned};

mod ledger;
pub use ledger::{Accounted, Ledger, Share, Writer};

/// Slot size the index log's ring aims for.
const SLOT_TARGET: usize = 16 << 10;

/// Least a log slot holds: one event's header and one block (the index log
/// checks that its header fits).
pub const MIN_SLOT_BYTES: usize = 48;

/// Geometry of the index log's ring of slots ([`crate::routing::index_log`])
/// for a `log_bytes` budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogShape {
    /// Number of slots in the ring.
    pub slots: u64,
    /// Largest encoded event a slot holds.
    pub slot_bytes: usize,
}

impl LogShape {
    /// Splits `log_bytes` into 16..1024 slots of about 16 KiB.
    pub fn new(log_bytes: usize) -> LogShape {
        let slots = (log_bytes / SLOT_TARGET).clamp(16, 1024);
        LogShape {
            slots: slots as u64,
            slot_bytes: (log_bytes / slots).max(MIN_SLOT_BYTES),
        }
    }

    /// The slot that event `seq` lives in.
    pub fn slot(&self, seq: u64) -> u64 {
        seq % self.slots.max(1)
    }
}

/// CAS attempts before an update is abandoned.
pub const MAX_CAS_RETRIES: u32 = 32;

/// The registry of the fleets using this Envoy's shared data (its layout's version in the name).
pub const FLEETS_KEY: &str = "warmroute.fleets.v1";

/// A fleet's registry entry.
#[derive(Debug, Clone, Copy)]
struct Fleet {
    id: u64,
    beat_ms: u64,
    log_bytes: u64,
    /// How long it may stay silent before it is swept.
    idle_ms: u64,
}

/// The ledger share that holds the gateway's other replicas' in-flight work
/// ([`Store::set_share`]), and the origin of the index events they sent: no
/// VM has this id (they count up from 1).
pub const PEERS_VM: u64 = u64::MAX;

/// How long a fleet must be silent before its values are swept.
pub const FLEET_IDLE_MS: u64 = 60_000;

/// Names of this fleet's shared-data keys.
#[derive(Debug, Clone)]
pub struct Keys {
    fleet: u64,
    log_bytes: usize,
    ledger: String,
    rotation: String,
    vm_seq: String,
    lease: String,
    health: String,
    served: String,
    members: String,
    lora: String,
    gate: String,
    replica: String,
    log_slots: Vec<String>,
    log_shape: LogShape,
}

impl Keys {
    /// Keys for the fleet identified by `fleet`, with an index log of `log_bytes`.
    ///
    /// Every key names its record's layout version (`.vN`): during a rolling
    /// reload the old listener's VMs keep serving while the new ones start
    /// (an LDS drain), and a release that changes a layout must bump its
    /// version, so each keeps its own record instead of misreading the
    /// other's. The tests pin each record's bytes, so a change of layout
    /// without a new version fails them.
    pub fn new(fleet: u64, log_bytes: usize) -> Keys {
        let k = |n: &str| format!("warmroute.{fleet:016x}.{n}");
        let log_shape = LogShape::new(log_bytes);
        Keys {
            fleet,
            log_bytes,
            // v5: the slot table moved to `members.v1`, and the ledger's shares are
            // per slot; every slot-indexed record moves with the slot table.
            ledger: k("ledger.v5"),
            rotation: k("rotation.v1"),
            vm_seq: k("vm_seq.v1"),
            lease: k("lease.v1"),
            // v1 was the same name without a version, before `own_inflight`.
            health: k("health.v2"),
            served: k("served.v1"),
            members: k("members.v1"),
            lora: k("lora.v1"),
            gate: k("gate.v2"),
            replica: k("replica.v1"),
            // The events carry their own layout version too ([`crate::fleet::store`]
            // only names the slots).
            log_slots: (0..log_shape.slots)
                .map(|i| k(&format!("index_log.v1.{i}")))
                .collect(),
            log_shape,
        }
    }

    /// The requests held at the gate ([`crate::gate::Queue`]).
    pub fn gate(&self) -> &str {
        &self.gate
    }

    /// Geometry of the index log.
    pub fn log_shape(&self) -> LogShape {
        self.log_shape
    }

    /// Every value of the fleet.
    fn every(&self) -> impl Iterator<Item = &str> {
        [
            &self.ledger,
            &self.rotation,
            &self.vm_seq,
            &self.lease,
            &self.health,
            &self.served,
            &self.members,
            &self.lora,
            &self.gate,
            &self.replica,
        ]
        .into_iter()
        .chain(&self.log_slots)
        .map(String::as_str)
    }

    /// The key of the log slot event `seq` lives in.
    pub fn log_slot(&self, seq: u64) -> &str {
        self.log_slots
            .get(self.log_shape.slot(seq) as usize)
            .map_or("", String::as_str)
    }
}

/// Read-modify-write of one key; `f` returns the new value or `None` to leave it.
pub fn update<H: Host, T>(
    host: &H,
    key: &str,
    f: impl FnMut(Option<Vec<u8>>) -> (Option<Vec<u8>>, T),
) -> Result<T, HostError> {
    update_after(host, key, None, f)
}

/// [`update`] whose first attempt starts from `seed`, a read of `key` the caller
/// already made: each host call costs microseconds in Envoy, and on the request
/// path the value was just read to decide, so only a lost CAS reads it again.
pub fn update_after<H: Host, T>(
    host: &H,
    key: &str,
    seed: Option<Versioned>,
    f: impl FnMut(Option<Vec<u8>>) -> (Option<Vec<u8>>, T),
) -> Result<T, HostError> {
    update_within(host, key, seed, MAX_CAS_RETRIES, f)
}

/// [`update_after`] in at most `attempts` CAS attempts (`Err(CasMismatch)` past them).
fn update_within<H: Host, T>(
    host: &H,
    key: &str,
    mut seed: Option<Versioned>,
    attempts: u32,
    mut f: impl FnMut(Option<Vec<u8>>) -> (Option<Vec<u8>>, T),
) -> Result<T, HostError> {
    for _ in 0..attempts {
        // A read of a missing key has no CAS token, and a write without one is
        // unconditional: such a seed could overwrite a value created since.
        let (value, cas) = match seed.take().filter(|(_, cas)| cas.is_some()) {
            Some(read) => read,
            None => host.get_shared(key)?,
        };
        let (new, out) = f(value);
        let Some(new) = new else { return Ok(out) };
        match host.set_shared(key, &new, cas) {
            Ok(()) => return Ok(out),
            Err(HostError::CasMismatch) => continue,
            Err(e) => return Err(e),
        }
    }
    Err(HostError::CasMismatch)
}

/// A decoded shared value and the raw read it came from, to seed a following update.
#[derive(Debug, Clone)]
pub struct Read<T> {
    /// The decoded value.
    pub value: T,
    /// The bytes and CAS token as read.
    pub raw: Versioned,
}

/// Typed access to the shared fleet state.
pub struct Store<'h, H: Host> {
    /// The host.
    pub host: &'h H,
    /// Key names.
    pub keys: &'h Keys,
    /// Number of backends.
    pub n: usize,
}

impl<H: Host> Store<'_, H> {
    /// A fleet-unique id for this VM (its lease identity and log origin).
    pub fn new_vm_id(&self) -> Result<u64, HostError> {
        self.take_number(&self.keys.vm_seq)
            .map(|n| n.wrapping_add(1))
    }

    /// This gateway replica's id among its peers ([`crate::fleet`] keeps it for
    /// the exchange): the first VM to ask sets it to `fresh` (a clock reading:
    /// two replicas would have to start in the same nanosecond to collide), the
    /// others read it.
    pub fn replica_id(&self, fresh: u64) -> Result<u64, HostError> {
        update(self.host, &self.keys.replica, |v| {
            match v.as_deref().and_then(|b| <[u8; 8]>::try_from(b).ok()) {
                Some(b) => (None, u64::from_le_bytes(b)),
                None => (Some(fresh.to_le_bytes().to_vec()), fresh),
            }
        })
    }

    /// The next value of the round-robin rotation shared by all workers.
    pub fn next_rotation(&self) -> Result<u64, HostError> {
        self.take_number(&self.keys.rotation)
    }

    /// Creates the values every worker updates from its first request on (the
    /// ledger; the rotation, if `rotating`), where missing. Each VM calls it
    /// as it is configured, before its first request: a missing key has no CAS
    /// token and Envoy's write of it is unconditional, so two workers' first
    /// requests creating it at once would both succeed and one's update would
    /// be lost (an in-flight count, an index-log sequence number, a rotation
    /// number handed out twice). Configurations racing each other write the
    /// same empty value and take nothing; only a creation whose read and write
    /// straddle another worker's configuration and first request could still
    /// undo an update.
    pub fn create_shared(&self, rotating: bool) -> Result<(), HostError> {
        let mut wanted = vec![(&self.keys.ledger, Ledger::default().encode())];
        if rotating {
            wanted.push((&self.keys.rotation, 0u64.to_le_bytes().to_vec()));
        }
        for (key, empty) in wanted {
            if self.host.get_shared(key)?.1.is_none() {
                self.host.set_shared(key, &empty, None)?;
            }
        }
        Ok(())
    }

    /// Takes the next number (from 0) of a counter every VM shares. Only a CAS
    /// hands a number out: a missing key is first created holding 0 (a write
    /// Envoy cannot make conditional) and taken from by the next update, so two
    /// VMs creating it at once both write 0 and neither has taken a number;
    /// taking from the creation would hand 0 to both.
    fn take_number(&self, key: &str) -> Result<u64, HostError> {
        for _ in 0..MAX_CAS_RETRIES {
            let taken = update(self.host, key, |v| match v {
                None => (Some(0u64.to_le_bytes().to_vec()), None),
                Some(v) => {
                    let n = codec::u64_value(Some(&v));
                    (Some(n.wrapping_add(1).to_le_bytes().to_vec()), Some(n))
                }
            })?;
            if let Some(n) = taken {
                return Ok(n);
            }
        }
        Err(HostError::CasMismatch)
    }

    /// In-flight requests and unanswered prefill per backend, as accounted by every worker.
    pub fn inflight(&self) -> Result<Vec<InFlight>, HostError> {
        self.read_ledger().map(|r| r.value.inflight)
    }

    /// The ledger, with the read that seeds [`Store::account`].
    pub fn read_ledger(&self) -> Result<Read<Ledger>, HostError> {
        let raw = self.host.get_shared(&self.keys.ledger)?;
        Ok(Read {
            value: Ledger::decode(raw.0.as_deref(), self.n),
            raw,
        })
    }

    /// One CAS on the ledger, starting from `seed` (an earlier read): adds
    /// `deltas[b]` to the writer's share of backend `b` (each field saturating
    /// at 0), refreshes its heartbeat, takes back abandoned shares (see
    /// "Self-healing") and, if `reserve`, takes the next log sequence number.
    pub fn account(
        &self,
        seed: Option<Versioned>,
        writer: Writer,
        deltas: &[Delta],
        reserve: bool,
    ) -> Result<Accounted, HostError> {
        self.account_within(seed, writer, deltas, reserve, MAX_CAS_RETRIES)
    }

    /// [`Store::account`] only if the ledger is still as `seed` read it: one
    /// CAS, `Err(CasMismatch)` (and nothing written) when another VM wrote
    /// since. A routing decision made on that read can then be made again.
    pub fn account_if_unchanged(
        &self,
        seed: Versioned,
        writer: Writer,
        deltas: &[Delta],
        reserve: bool,
    ) -> Result<Accounted, HostError> {
        self.account_within(Some(seed), writer, deltas, reserve, 1)
    }

    fn account_within(
        &self,
        seed: Option<Versioned>,
        writer: Writer,
        deltas: &[Delta],
        reserve: bool,
        attempts: u32,
    ) -> Result<Accounted, HostError> {
        let n = self.n;
        update_within(self.host, &self.keys.ledger, seed, attempts, |v| {
            let ledger = Ledger::decode(v.as_deref(), n);
            let mut reclaimed = Vec::new();
            let mut mine = Share {
                vm: writer.vm,
                heartbeat_ms: writer.now_ms,
                lease_ms: writer.lease_ms,
                inflight: Sparse::new(),
            };
            let mut shares = Vec::with_capacity(ledger.shares.len() + 1);
            for s in ledger.shares {
                if s.vm == writer.vm {
                    mine.inflight = s.inflight;
                } else if writer.abandoned(&s) {
                    reclaimed.push(s.vm);
                } else if !s.is_empty() {
                    shares.push(s);
                }
            }
            mine.inflight = apply_sparse(&mine.inflight, deltas);
            if !mine.is_empty() {
                shares.push(mine);
            }
            let seq = reserve.then_some(ledger.next_seq);
            let next_seq = ledger.next_seq.wrapping_add(u64::from(reserve));
            let ledger = Ledger::with_total(next_seq, shares, n);
            (
                Some(ledger.encode()),
                Accounted {
                    ledger,
                    seq,
                    reclaimed,
                },
            )
        })
    }

    /// Sets `writer.vm`'s share to `inflight` as a whole (not by deltas), or
    /// drops it when empty: what a source outside this Envoy's VMs holds (the
    /// gateway's other replicas, [`crate::fleet`] keeps it for routing's
    /// exchange), counted in every VM's load like a VM's own. It lapses with
    /// `writer.lease_ms` as a VM's share does.
    pub fn set_share(&self, writer: Writer, inflight: Sparse) -> Result<(), HostError> {
        let n = self.n;
        update(self.host, &self.keys.ledger, |v| {
            let ledger = Ledger::decode(v.as_deref(), n);
            let mut shares: Vec<Share> = ledger
                .shares
                .into_iter()
                .filter(|s| s.vm != writer.vm)
                .collect();
            if !inflight.is_empty() {
                shares.push(Share {
                    vm: writer.vm,
                    heartbeat_ms: writer.now_ms,
                    lease_ms: writer.lease_ms,
                    inflight: inflight.clone(),
                });
            }
            (
                Some(Ledger::with_total(ledger.next_seq, shares, n).encode()),
                (),
            )
        })
    }

    /// Health of every backend as the scraper last published it.
    pub fn health(&self) -> Result<Vec<Health>, HostError> {
        let v = self.host.get_shared(&self.keys.health)?.0;
        Ok(decode_health(v.as_deref().unwrap_or_default(), self.n))
    }

    /// Applies `f` to one backend's health.
    pub fn update_health(
        &self,
        backend: usize,
        f: impl Fn(&mut Health),
    ) -> Result<Health, HostError> {
        let n = self.n;
        update(self.host, &self.keys.health, |v| {
            let mut all = decode_health(v.as_deref().unwrap_or_default(), n);
            let out = all.get_mut(backend).map(|h| {
                f(h);
                *h
            });
            (Some(encode_health(&all)), out.unwrap_or_default())
        })
    }

    /// The slot table of a discovered pool, as last published (`None`: none yet).
    pub fn members(&self) -> Result<Option<Slots>, HostError> {
        let v = self.host.get_shared(&self.keys.members)?.0;
        Ok(v.and_then(|v| Slots::decode(&v, self.n)))
    }

    /// Read-modify-write of the slot table; written only when `f` changed it.
    pub fn update_members<T>(
        &self,
        mut f: impl FnMut(Option<Slots>) -> (Slots, T),
    ) -> Result<(Slots, T), HostError> {
        let n = self.n;
        update(self.host, &self.keys.members, |v| {
            let current = v.as_deref().and_then(|v| Slots::decode(v, n));
            let (slots, out) = f(current.clone());
            let write = (current.as_ref() != Some(&slots)).then(|| slots.encode());
            (write, (slots, out))
        })
    }

    /// Starts the per-slot records (health, LoRA state, last answer) of
    /// `slots` over: another pod holds each now.
    pub fn reset_slots(&self, slots: &[usize]) -> Result<(), HostError> {
        if slots.is_empty() {
            return Ok(());
        }
        let n = self.n;
        update(self.host, &self.keys.health, |v| {
            let mut all = decode_health(v.as_deref().unwrap_or_default(), n);
            for &b in slots {
                if let Some(h) = all.get_mut(b) {
                    *h = Health::default();
                }
            }
            (Some(encode_health(&all)), ())
        })?;
        self.update_lora(n, |all| {
            for &b in slots {
                if let Some(l) = all.get_mut(b) {
                    *l = None;
                }
            }
        })?;
        update(self.host, &self.keys.served, |v| {
            let mut all = decode_served(v.as_deref().unwrap_or_default(), n);
            for &b in slots {
                if let Some(t) = all.get_mut(b) {
                    *t = 0;
                }
            }
            (Some(encode_served(&all)), ())
        })
    }

    /// Every slot's LoRA state as the scraper last published it.
    pub fn lora(&self) -> Result<Vec<Option<Lora>>, HostError> {
        let v = self.host.get_shared(&self.keys.lora)?.0;
        Ok(decode_lora(v.as_deref().unwrap_or_default(), self.n))
    }

    /// Read-modify-write of every slot's LoRA state; returns the new state.
    pub fn update_lora(
        &self,
        n: usize,
        mut f: impl FnMut(&mut Vec<Option<Lora>>),
    ) -> Result<Vec<Option<Lora>>, HostError> {
        update(self.host, &self.keys.lora, |v| {
            let mut all = decode_lora(v.as_deref().unwrap_or_default(), n);
            f(&mut all);
            (Some(encode_lora(&all)), all)
        })
    }

    /// When each backend last answered a request routed by any VM (0: never).
    pub fn served(&self) -> Result<Vec<u64>, HostError> {
        let v = self.host.get_shared(&self.keys.served)?.0;
        Ok(decode_served(v.as_deref().unwrap_or_default(), self.n))
    }

    /// Merges one VM's last-answered times into the shared ones (the later wins).
    pub fn publish_served(&self, mine: &[u64]) -> Result<(), HostError> {
        let n = self.n;
        update(self.host, &self.keys.served, |v| {
            let mut all = decode_served(v.as_deref().unwrap_or_default(), n);
            let mut newer = false;
            for (a, &m) in all.iter_mut().zip(mine) {
                newer |= m > *a;
                *a = (*a).max(m);
            }
            (newer.then(|| encode_served(&all)), ())
        })
    }

    /// Heartbeats this fleet in the registry and sweeps the fleets silent for
    /// `idle_ms` (see "Fleets that are gone"); returns the swept fleet ids.
    pub fn sweep_fleets(&self, now_ms: u64, idle_ms: u64) -> Result<Vec<u64>, HostError> {
        const ENTRY: usize = 32;
        let me = Fleet {
            id: self.keys.fleet,
            beat_ms: now_ms,
            log_bytes: self.keys.log_bytes as u64,
            idle_ms,
        };
        let gone = update(self.host, FLEETS_KEY, |v| {
            let v = v.unwrap_or_default();
            // Another layout is nobody's entry: dropping it strands, never sweeps, a fleet.
            let bytes = if v.len() % ENTRY == 0 {
                &v[..]
            } else {
                &[][..]
            };
            let mut r = Reader::new(bytes);
            let (mut keep, mut gone) = (Vec::new(), Vec::new());
            while let (Some(id), Some(beat_ms), Some(log_bytes), Some(idle)) =
                (r.get(), r.get(), r.get(), r.get())
            {
                let f = Fleet {
                    id,
                    beat_ms,
                    log_bytes,
                    idle_ms: idle,
                };
                if f.id == me.id {
                    continue;
                }
                // Each fleet by its own patience: its ticks may be far apart.
                if now_ms.saturating_sub(f.beat_ms) > f.idle_ms {
                    gone.push(f);
                } else {
                    keep.push(f);
                }
            }
            keep.push(me);
            let mut out = Vec::with_capacity(keep.len() * ENTRY);
            for f in keep {
                put(&mut out, f.id);
                put(&mut out, f.beat_ms);
                put(&mut out, f.log_bytes);
                put(&mut out, f.idle_ms);
            }
            (Some(out), gone)
        })?;
        for f in &gone {
            let keys = Keys::new(f.id, usize::try_from(f.log_bytes).unwrap_or(0));
            for k in keys.every() {
                // Best effort: an unswept value is a stranded one, no worse.
                let _ = self.host.set_shared(k, &[], None);
            }
        }
        Ok(gone.into_iter().map(|f| f.id).collect())
    }

    /// The pod that answered the stored response `id` (hashed), as the record
    /// of answers holds it ([`crate::fleet::responses`]): one read of its bucket.
    pub fn response_holder(&self, id: u64) -> Result<Option<Entry>, HostError> {
        let key = responses::key(responses::bucket_of(id));
        let v = self.host.get_shared(&key)?.0;
        Ok(responses::find(v.as_deref().unwrap_or_default(), id))
    }

    /// Remembers who answered a stored response, in a bucket of at most
    /// `capacity` entries ([`responses::insert`]).
    pub fn remember_response(&self, entry: Entry, capacity: usize) -> Result<(), HostError> {
        let key = responses::key(responses::bucket_of(entry.id));
        update(self.host, &key, |v| {
            let all = responses::decode(v.as_deref().unwrap_or_default());
            let all = responses::insert(all, entry, capacity);
            (Some(responses::encode(&all)), ())
        })
    }

    /// Remembers who answered a stored response, as a peer replica sent it
    /// ([`responses::insert_imported`]: never over what this Envoy knows newer);
    /// true if it was written.
    pub fn remember_imported(&self, entry: Entry, capacity: usize) -> Result<bool, HostError> {
        let key = responses::key(responses::bucket_of(entry.id));
        update(self.host, &key, |v| {
            let all = responses::decode(v.as_deref().unwrap_or_default());
            match responses::insert_imported(all, entry, capacity) {
                Some(all) => (Some(responses::encode(&all)), true),
                None => (None, false),
            }
        })
    }

    /// Appends an answer this Envoy proxied to the ring its peers pull
    /// ([`responses::Recent`]).
    pub fn share_response(&self, entry: Entry) -> Result<(), HostError> {
        update(self.host, responses::RECENT_KEY, |v| {
            let ring = responses::Recent::decode(v.as_deref().unwrap_or_default());
            (Some(ring.push(entry).encode()), ())
        })
    }

    /// The ring of answers this Envoy proxied lately, for a peer's pull.
    pub fn recent_responses(&self) -> Result<responses::Recent, HostError> {
        let v = self.host.get_shared(responses::RECENT_KEY)?.0;
        Ok(responses::Recent::decode(v.as_deref().unwrap_or_default()))
    }

    /// Takes or renews the scraper lease; true when this VM holds it.
    pub fn try_lease(&self, me: u64, ttl_ms: u64) -> Result<bool, HostError> {
        let now = self.host.now_ms();
        update(self.host, &self.keys.lease, |v| {
            let mut r = Reader::new(v.as_deref().unwrap_or_default());
            let (holder, expiry) = (r.get().unwrap_or(0u64), r.get().unwrap_or(0u64));
            if holder == me || holder == 0 || expiry < now {
                let mut new = Vec::with_capacity(16);
                put(&mut new, me);
                put(&mut new, now + ttl_ms);
                (Some(new), true)
            } else {
                (None, false)
            }
        })
    }
}

/// Encodes every slot's last-answered time.
fn encode_served(all: &[u64]) -> Vec<u8> {
    let mut out = Vec::with_capacity(all.len() * 8);
    all.iter().for_each(|&t| put(&mut out, t));
    out
}

/// Decodes `n` last-answered times; a blob of another length (another fleet) reads as "never".
fn decode_served(bytes: &[u8], n: usize) -> Vec<u64> {
    let mut r = Reader::new(bytes);
    let all: Option<Vec<u64>> = (0..n).map(|_| r.get()).collect();
    all.filter(|_| bytes.len() == n * 8)
        .unwrap_or_else(|| vec![0; n])
}

#[cfg(test)]
mod tests;
