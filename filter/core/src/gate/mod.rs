//! Priority classes and deadlines at the gate: while every pod that could
//! serve a request is past its knee, the request waits in Envoy (paused, its
//! body in Envoy's buffer) rather than in a vLLM queue, where it would wait
//! in arrival order behind batch work. Held requests leave highest class
//! first, earliest deadline first within a class, as capacity returns.
//!
//! ```text
//! headroom_b = min( knee.requests − gate_load_b,  knee.work − work_b,   (each if set)
//!                   0 if waiting_b ≥ knee.waiting or kv_b ≥ knee.kv_usage else ∞ )
//! slots_b    = ceil(headroom_b)  (∞ → 1 per release round)  − grants not yet routed to b
//! admit      ⇔ no request is held  ∧  some eligible pod has headroom_b > 0
//! release order: (class rank, deadline, arrival); every k-th release, k = round(1 / lower_share),
//!                goes to the best held request of a class below the best one's, those classes
//!                taking turns (no class starves)
//! deadline   = arrival + min(deadline header, class.max_wait_ms)
//! shed (429, Retry-After) ⇔ deadline passed ∨ the class already holds max_queue requests
//!                            ∨ the held bodies would pass max_held_bytes
//! ```
//! `gate_load_b` and `work_b` are [`crate::routing::load`]'s and [`crate::routing::work`]'s: this
//! gateway's in-flight requests plus what a fresh scrape shows beyond them
//! (for the request count, also less what it shows finished: a client that
//! stopped reading does not hold the knee; `knee.work` still counts those
//! streams' decode budgets), so a request ending frees headroom at once, and a
//! scrape's queue or KV usage holds a pod at its knee until the next scrape
//! says otherwise.
//!
//! **Across worker VMs.** Envoy runs a VM per worker, and a paused request can
//! only be resumed by its own VM. The held requests of the whole gateway are
//! one shared record (this module's [`Queue`]: one [`Ticket`] per request,
//! naming its VM, its HTTP context and that VM's wake-up queue), so the order
//! holds across workers. Whoever frees capacity (a request ending, a tick)
//! picks the next tickets in one CAS and wakes their VMs through proxy-wasm
//! shared queues; a ticket granted to another VM stays in the record,
//! reserving its pod's slot, until that VM has routed it. A VM resumes its own
//! grants at once. Every VM also runs the gate at `check_ms` (default 50 ms),
//! which sheds its expired requests and releases any grant a lost wake-up
//! left behind: a held request never waits a whole scrape period, and never
//! hangs. A VM that holds tickets beats in the record ([`Beat`]) at least
//! every third of its ledger lease; one that crashed or was torn down stops,
//! and the first write after its lease drops its tickets, held and granted,
//! instead of leaving them in the order until their deadlines.
//!
//! | parameter | default | why |
//! |---|---|---|
//! | `gate.knee.*` | none (one is required) | the operator knows the replica's knee: vLLM's `max_num_seqs`, or where TTFT starts to climb in a load test |
//! | classes | `interactive` (5 s, 256) > `standard` (30 s, 256) > `batch` (55 s, 512) | max wait and queue per class: a chat user gives up in seconds; a batch job would wait minutes, but Envoy's `request_timeout` (60 s in the shipped configs) runs until the request goes upstream, so a longer wait needs a longer one |
//! | `gate.lower_share` | 0.1 | one release in ten goes to a lower class while a higher one waits: batch progresses under sustained interactive load |
//! | `gate.check_ms` | 50 | expiry and missed wake-ups within a twentieth of a second |
//! | `gate.retry_after_s` | 1 | `Retry-After` of a shed request |
//! | `gate.max_held_bytes` | 128 MiB | Envoy buffers each held request's body: Σ `max_queue` × `max_body_bytes` is 8 GiB with the defaults, against the 512 MiB heap the shipped configs give Envoy's overload manager, and HTTP/1 streams are not reset by it |
//! | lease of a VM's tickets | its ledger lease, `max(3 × metrics.period_ms, 1 s)` | as for its in-flight share: a live VM renews it every third |
//! | [`GRANT_TTL_MS`] | 2000 | a grant its live VM never routed (a lost wake-up it did not recover) stops reserving its pod |
//!
//! Cost: nothing while the gate is not configured. With it, below the knee a
//! routed request reads the small queue record once (empty) and takes one
//! more pass over the pods (their headroom; the ledger read it comes from is
//! the one its route uses), and a request ending reads the record once more;
//! a held request costs a CAS on it to enter and one to leave. The record holds at most Σ `max_queue` tickets (~40 bytes
//! each, plus the eligibility mask of a gateway with several models).

use crate::codec::{put, Reader};

/// A grant its (live) VM has not routed within this long no longer reserves a pod.
pub const GRANT_TTL_MS: u64 = 2000;

/// One held request.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Ticket {
    /// The VM holding it.
    pub vm: u64,
    /// Its HTTP context in that VM.
    pub context: u32,
    /// That VM's wake-up queue (0: none; it finds its grants at its check).
    pub wake: u32,
    /// Class rank.
    pub class: u8,
    /// When it is shed, host milliseconds.
    pub deadline_ms: u64,
    /// Arrival order, gateway-wide.
    pub seq: u64,
    /// When it was granted (0: still held).
    pub granted_ms: u64,
    /// The pod its grant reserves a slot on.
    pub pod: u16,
    /// The request body's bytes Envoy buffers while it is held.
    pub bytes: u32,
    /// The slots that may serve it, a bit per slot (empty: any).
    pub eligible: Vec<u8>,
}

impl Ticket {
    /// Whether slot `b` may serve it.
    pub fn fits(&self, b: usize) -> bool {
        self.eligible.is_empty()
            || self
                .eligible
                .get(b / 8)
                .is_some_and(|m| m >> (b % 8) & 1 == 1)
    }

    fn order(&self) -> (u8, u64, u64) {
        (self.class, self.deadline_ms, self.seq)
    }
}

/// The pods with a slot free, for one grant.
struct Open {
    /// A bit per pod with a slot free, as [`Ticket::eligible`] lays them out.
    mask: Vec<u8>,
    /// The pod with the most free slots (the lowest such): where a ticket any pod may serve goes.
    most: Option<usize>,
}

impl Open {
    fn of(slots: &[u32]) -> Open {
        let most = (0..slots.len())
            .filter(|&b| slots[b] > 0)
            .max_by_key(|&b| (slots[b], std::cmp::Reverse(b)));
        // Spelled out even when every pod has room (unlike [`mask`]): a ticket's
        // bits past the fleet then match nothing.
        let mut open = vec![0u8; slots.len().div_ceil(8)];
        for b in (0..slots.len()).filter(|&b| slots[b] > 0) {
            open[b / 8] |= 1 << (b % 8);
        }
        Open { mask: open, most }
    }

    /// Whether some pod with a free slot may serve `t`: a byte-wise test.
    fn fits(&self, t: &Ticket) -> bool {
        if t.eligible.is_empty() {
            return self.most.is_some();
        }
        t.eligible.iter().zip(&self.mask).any(|(e, o)| e & o != 0)
    }

    /// The pod with the most free slots that may serve `t`.
    fn pod_for(&self, t: &Ticket, slots: &[u32]) -> Option<usize> {
        if t.eligible.is_empty() {
            return self.most;
        }
        (0..slots.len())
            .filter(|&b| slots[b] > 0 && t.fits(b))
            .max_by_key(|&b| (slots[b], std::cmp::Reverse(b)))
    }
}

/// The eligibility mask of the slots in `eligible` out of `n` (empty when all are).
pub fn mask(eligible: impl Iterator<Item = bool>, n: usize) -> Vec<u8> {
    let mut m = vec![0u8; n.div_ceil(8)];
    let mut all = true;
    for (b, ok) in eligible.take(n).enumerate() {
        if ok {
            m[b / 8] |= 1 << (b % 8);
        }
        all &= ok;
    }
    if all {
        Vec::new()
    } else {
        m
    }
}

/// A VM's sign of life in the queue record, as its share of the ledger
/// carries one ([`crate::fleet::store`]): a VM that crashed, or was torn down
/// without routing or shedding its held requests, stops beating, and the
/// next write by any other VM drops its tickets (held or granted) with its
/// beat, so they neither hold a place in the order nor reserve a pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Beat {
    /// The VM.
    pub vm: u64,
    /// Host time of its last beat.
    pub beat_ms: u64,
    /// How long after it the VM counts as gone (its ledger lease).
    pub lease_ms: u64,
}

/// Every request this gateway holds, in shared data.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Queue {
    /// The next arrival's `seq`.
    pub next_seq: u64,
    /// Releases so far (picks every k-th for a lower class).
    pub releases: u64,
    /// The VMs that hold tickets, and when each last said it is alive.
    pub beats: Vec<Beat>,
    /// Held and granted requests, in no particular order.
    pub tickets: Vec<Ticket>,
}

/// Layout version, first in the record (and in its key, `gate.v2`).
const VERSION: u8 = 2;

impl Queue {
    /// The record as shared data holds it.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(19 + self.beats.len() * 24 + self.tickets.len() * 40);
        put(&mut out, VERSION);
        put(&mut out, self.next_seq);
        put(&mut out, self.releases);
        put(&mut out, self.beats.len() as u16);
        for b in &self.beats {
            put(&mut out, b.vm);
            put(&mut out, b.beat_ms);
            put(&mut out, b.lease_ms);
        }
        for t in &self.tickets {
            put(&mut out, t.vm);
            put(&mut out, t.context);
            put(&mut out, t.wake);
            put(&mut out, t.class);
            put(&mut out, t.deadline_ms);
            put(&mut out, t.seq);
            put(&mut out, t.granted_ms);
            put(&mut out, t.pod);
            put(&mut out, t.bytes);
            put(&mut out, t.eligible.len() as u16);
            out.extend_from_slice(&t.eligible);
        }
        out
    }

    /// Decodes a record; an empty, foreign or damaged one is an empty queue
    /// (its requests are shed by their own VMs at their deadlines).
    pub fn decode(bytes: &[u8]) -> Queue {
        Self::try_decode(bytes).unwrap_or_default()
    }

    fn try_decode(bytes: &[u8]) -> Option<Queue> {
        let mut r = Reader::new(bytes);
        if r.get::<u8>()? != VERSION {
            return None;
        }
        let mut q = Queue {
            next_seq: r.get()?,
            releases: r.get()?,
            ..Queue::default()
        };
        for _ in 0..r.get::<u16>()? {
            q.beats.push(Beat {
                vm: r.get()?,
                beat_ms: r.get()?,
                lease_ms: r.get()?,
            });
        }
        while !r.rest().is_empty() {
            let mut t = Ticket {
                vm: r.get()?,
                context: r.get()?,
                wake: r.get()?,
                class: r.get()?,
                deadline_ms: r.get()?,
                seq: r.get()?,
                granted_ms: r.get()?,
                pod: r.get()?,
                bytes: r.get()?,
                eligible: Vec::new(),
            };
            let len = usize::from(r.get::<u16>()?);
            let rest = r.rest();
            t.eligible = rest.get(..len)?.to_vec();
            r = Reader::new(&rest[len..]);
            q.tickets.push(t);
        }
        Some(q)
    }

    /// Requests of class `rank` held (granted ones are on their way out).
    pub fn held(&self, rank: usize) -> u32 {
        self.tickets
            .iter()
            .filter(|t| t.granted_ms == 0 && usize::from(t.class) == rank)
            .count() as u32
    }

    /// Body bytes of the requests held (not yet granted).
    pub fn held_bytes(&self) -> u64 {
        self.tickets
            .iter()
            .filter(|t| t.granted_ms == 0)
            .map(|t| u64::from(t.bytes))
            .sum()
    }

    /// Whether any request is held (not yet granted).
    pub fn any_held(&self) -> bool {
        self.tickets.iter().any(|t| t.granted_ms == 0)
    }

    /// Adds a ticket at the back of the arrival order; returns its `seq`.
    pub fn push(&mut self, mut t: Ticket) -> u64 {
        t.seq = self.next_seq;
        t.granted_ms = 0;
        self.next_seq = self.next_seq.wrapping_add(1);
        let seq = t.seq;
        self.tickets.push(t);
        seq
    }

    /// Takes out the ticket of (`vm`, `context`), if there.
    pub fn remove(&mut self, vm: u64, context: u32) -> Option<Ticket> {
        let i = self
            .tickets
            .iter()
            .position(|t| t.vm == vm && t.context == context)?;
        Some(self.tickets.swap_remove(i))
    }

    /// Records that `vm` is alive at `now_ms`, for `lease_ms` more.
    pub fn beat(&mut self, vm: u64, now_ms: u64, lease_ms: u64) {
        let beat = Beat {
            vm,
            beat_ms: now_ms,
            lease_ms,
        };
        match self.beats.iter_mut().find(|b| b.vm == vm) {
            Some(b) => *b = beat,
            None => self.beats.push(beat),
        }
    }

    /// When `vm` last beat, if it has a beat here.
    pub fn beat_of(&self, vm: u64) -> Option<u64> {
        self.beats.iter().find(|b| b.vm == vm).map(|b| b.beat_ms)
    }

    /// Drops what nobody will route: the tickets of VMs whose beat is past
    /// its lease (or that have none), grants older than [`GRANT_TTL_MS`], and
    /// held tickets a whole TTL past their deadline (their VM would have shed
    /// them).
    pub fn sweep(&mut self, now_ms: u64) {
        self.beats
            .retain(|b| now_ms.saturating_sub(b.beat_ms) < b.lease_ms);
        let beats = &self.beats;
        self.tickets.retain(|t| {
            let alive = beats.iter().any(|b| b.vm == t.vm);
            alive
                && if t.granted_ms > 0 {
                    now_ms.saturating_sub(t.granted_ms) < GRANT_TTL_MS
                } else {
                    now_ms < t.deadline_ms.saturating_add(GRANT_TTL_MS)
                }
        });
    }

    /// Grants held tickets while pods have slots, in the release order at the
    /// top of the module. `slots[b]`: requests pod `b` takes before its knee
    /// (grants already out are subtracted here). Each grant is marked with
    /// `now_ms` and its pod, and returned.
    pub fn grant(&mut self, slots: &mut [u32], now_ms: u64, lower_every: u64) -> Vec<Ticket> {
        for t in self.tickets.iter().filter(|t| t.granted_ms > 0) {
            if let Some(s) = slots.get_mut(usize::from(t.pod)) {
                *s = s.saturating_sub(1);
            }
        }
        // Sorted once; each grant then costs O(pods + held · pods / 8): it runs
        // inside a CAS that may be retried, with up to a thousand of each.
        let mut waiting: Vec<usize> = (0..self.tickets.len())
            .filter(|&i| self.tickets[i].granted_ms == 0)
            .collect();
        waiting.sort_by_key(|&i| self.tickets[i].order());
        let mut out = Vec::new();
        loop {
            let open = Open::of(slots);
            let can_go = |t: &Ticket| open.fits(t);
            let Some(first) = waiting.iter().position(|&i| can_go(&self.tickets[i])) else {
                break;
            };
            let lower_turn = lower_every > 0 && self.releases % lower_every == lower_every - 1;
            let top = self.tickets[waiting[first]].class;
            let mut at = first;
            if lower_turn {
                // Lower turns go round the classes below the top that have a request
                // that can go, so the lowest is not starved by the one in between.
                let mut lower: Vec<u8> = waiting[first..]
                    .iter()
                    .map(|&i| &self.tickets[i])
                    .filter(|t| t.class > top && can_go(t))
                    .map(|t| t.class)
                    .collect();
                lower.dedup();
                let turn = self.releases / lower_every;
                if let Some(&class) = lower.get((turn % lower.len().max(1) as u64) as usize) {
                    at = waiting
                        .iter()
                        .position(|&i| self.tickets[i].class == class && can_go(&self.tickets[i]))
                        .unwrap_or(first);
                }
            }
            let pick = waiting.remove(at);
            let Some(pod) = open.pod_for(&self.tickets[pick], slots) else {
                break;
            };
            slots[pod] -= 1;
            self.releases = self.releases.wrapping_add(1);
            let t = &mut self.tickets[pick];
            t.granted_ms = now_ms.max(1);
            t.pod = pod as u16;
            out.push(t.clone());
        }
        out
    }
}

/// The body of a shed request, in OpenAI's error shape.
pub fn shed_body(class: &str, why: Shed) -> Vec<u8> {
    let message = match why {
        Shed::Deadline => format!(
            "Every replica is at capacity and this {class} request's deadline passed before one \
             had room. Retry later."
        ),
        Shed::QueueFull => {
            format!("Every replica is at capacity and the {class} queue is full. Retry later.")
        }
    };
    serde_json::json!({"error": {
        "message": message,
        "type": "rate_limit_error",
        "param": null,
        "code": why.name(),
    }})
    .to_string()
    .into_bytes()
}

/// Why a request was answered 429 instead of routed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shed {
    /// Its deadline (or its class's longest wait) passed while held.
    Deadline,
    /// Its class already held `max_queue` requests.
    QueueFull,
}

impl Shed {
    /// Stable name (stats, the error's `code`).
    pub fn name(self) -> &'static str {
        match self {
            Shed::Deadline => "deadline_exceeded",
            Shed::QueueFull => "queue_full",
        }
    }
}

#[cfg(test)]
mod tests;
