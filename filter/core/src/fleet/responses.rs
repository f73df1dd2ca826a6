//! Which pod answered each stored response, so that a follow-up naming it
//! (`previous_response_id`) goes to the one pod that can serve it.
//!
//! **The rule.** A `/v1/responses` request whose `previous_response_id` this
//! record holds goes to the pod that answered that response, whatever its
//! load, if that pod is a member of the pool in rotation. Otherwise (an id
//! the record does not hold, a pod that left the pool, a pod out of
//! rotation) the request routes as usual, and the stats say which.
//!
//! **Why.** vLLM keeps stored responses (`VLLM_ENABLE_RESPONSES_API_STORE=1`)
//! in the memory of the process that answered them
//! (`OpenAIServingResponses.response_store`, a dict, and `msg_store` beside
//! it): any other pod answers the follow-up 404 ("Response with id '…' not
//! found."), and the conversation's KV cache is on that pod too (the
//! follow-up's prompt is the stored messages, the stored answer, then the new
//! input). No load bound can move such a request: no other pod can serve it.
//!
//! ```text
//! entry   = (id, pod, at)     id  = hash::response_id(the id the answer names), 8 bytes
//!                             pod = hash::address_id(Envoy's upstream address that answered)
//!                             at  = host time the answer's id was read (ms)
//! bucket  = id >> 56          (of BUCKETS = 256), key `warmroute.responses.v1.<bucket>`
//! insert  : an entry of the same id is replaced; a bucket past its capacity
//!           drops its oldest `at` first (capacity = ceil(responses.max_entries / 256))
//! lookup  : the entry of that id, if any
//! ```
//!
//! **Trust.** An entry is written only from an answer, for the pod Envoy
//! reports as that exchange's upstream (`upstream.address`, the last try's),
//! or from a peer replica's reply, which arrives only from the peers cluster
//! on the peer port ([`crate::routing::exchange`]): never from anything a
//! client sends. A client that names an id reaches only
//! the pod that answered that id, which is where vLLM would serve it; an id
//! it made up is unknown and routes as usual. (vLLM lets a client choose its
//! response's id, `request_id`; the pod that answered still is the pod that
//! holds it.) Ids are hashed where they are read ([`crate::prompt::openai`],
//! [`crate::prompt::openai::answer`]): the record never holds a client's
//! string, every entry is 24 bytes, and its size is fixed by the
//! configuration whatever the ids. Entries are not refreshed by a lookup: a
//! conversation's next answer brings a newer id.
//!
//! **Its keys are this Envoy's, not a fleet's** (like the fleets registry):
//! a response's id names it on every fleet, and an entry names its pod by the
//! pod's address, not by a slot. A reload that changes the backend list keeps
//! the record, so conversations in progress go on; a fleet that finds a pod it
//! does not have routes as usual. Bounded all the same: 256 keys, each at
//! most the largest capacity any configuration writes, and the recent ring.
//!
//! **Across gateway replicas**: a load balancer in front of several gateways
//! sends a follow-up to any of them, and only the one that proxied the answer
//! has it in its record. An entry is self-contained (the id's hash, the pod's
//! address id, the same on every gateway, and when it was read), so the
//! exchange ([`crate::routing::exchange`]) carries entries as they are, with
//! no slot table to agree on. With peers configured, an answer is also
//! appended to this Envoy's *recent* ring, which a peer's pull reads from its
//! cursor on; what a peer sent goes into the buckets only, so it is never
//! served again (no echo between replicas).
//!
//! ```text
//! recent  = next u64 ‖ n u16 ‖ n × entry, oldest first; entry k is answer number next − n + k
//!           key `warmroute.responses.recent.v1`, at most RECENT entries (the oldest go)
//! ```
//!
//! | parameter | value | why |
//! |---|---|---|
//! | `responses.max_entries` | 16,384 | the conversations whose latest answer a gateway remembers (an agent's next step names its previous one); 384 KB in all, 1.5 KB a bucket |
//! | [`BUCKETS`] | 256 | a lookup reads one bucket, not the record: 1.5 KB at the default |
//! | [`RECENT`] | 256 | answers a peer can miss between two pulls (a tick apart): 512 answers a second at the default 500 ms; 6 KB read per pull |
//!
//! Cost: a follow-up reads one bucket (one host call); an answer costs one
//! CAS on its bucket (two host calls, more on a lost CAS), and with peers one
//! more on the ring (6 KB rewritten, one key every worker writes: answers are
//! a request's end, not its every chunk). A peer's answer costs a CAS on its
//! bucket, at the puller's tick.

use crate::codec::{put, Reader};
use crate::config::MAX_RESPONSES;

/// Keys the record is spread over.
pub const BUCKETS: usize = 256;

/// Bytes of one entry: id, pod, time.
pub const ENTRY_BYTES: usize = 24;

/// Most entries of one bucket any configuration writes: a larger value is
/// not this layout, and reads as empty.
const MAX_BUCKET_ENTRIES: usize = MAX_RESPONSES / BUCKETS;

/// One remembered answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    /// The response's id, hashed ([`crate::hash::response_id`]).
    pub id: u64,
    /// The pod that answered it: its address id ([`crate::hash::address_id`]).
    pub pod: u64,
    /// Host time the answer's id was read (ms).
    pub at_ms: u64,
}

/// Answers the recent ring keeps for peers.
pub const RECENT: usize = 256;

/// The shared-data key of the recent ring (its layout's version in the name).
pub const RECENT_KEY: &str = "warmroute.responses.recent.v1";

/// The recent ring: the number the next answer gets, and the last answers,
/// oldest first. A value of another layout reads as empty.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Recent {
    /// Number of the next answer appended.
    pub next: u64,
    /// The kept answers: entry k is answer `next − entries.len() + k`.
    pub entries: Vec<Entry>,
}

impl Recent {
    /// Decodes the ring's value.
    pub fn decode(bytes: &[u8]) -> Recent {
        let mut r = Reader::new(bytes);
        let (Some(next), Some(n)) = (r.get::<u64>(), r.get::<u16>()) else {
            return Recent::default();
        };
        let n = usize::from(n);
        let rest = r.rest();
        if n > RECENT || rest.len() != n * ENTRY_BYTES || (n as u64) > next {
            return Recent::default();
        }
        Recent {
            next,
            entries: entries(rest),
        }
    }

    /// The ring's value.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(10 + self.entries.len() * ENTRY_BYTES);
        put(&mut out, self.next);
        put(&mut out, self.entries.len() as u16);
        out.extend_from_slice(&encode(&self.entries));
        out
    }

    /// The ring with `e` appended (the oldest dropped past [`RECENT`]).
    pub fn push(mut self, e: Entry) -> Recent {
        if self.entries.len() >= RECENT {
            self.entries.remove(0);
        }
        self.entries.push(e);
        self.next += 1;
        self
    }

    /// The answers numbered `since` on that the ring still holds, with their
    /// numbers. A cursor past `next` is a peer's of an earlier life of this
    /// Envoy: it gets the whole ring.
    pub fn since(&self, since: u64) -> impl Iterator<Item = (u64, &Entry)> {
        let first = self.next - self.entries.len() as u64;
        let since = if since > self.next { 0 } else { since };
        self.entries
            .iter()
            .enumerate()
            .map(move |(k, e)| (first + k as u64, e))
            .filter(move |&(n, _)| n >= since)
    }
}

/// The bucket an id lives in.
pub fn bucket_of(id: u64) -> usize {
    (id >> 56) as usize % BUCKETS
}

/// The shared-data key of bucket `b` (its layout's version in the name).
pub fn key(bucket: usize) -> String {
    format!("warmroute.responses.v1.{bucket}")
}

/// Entries per bucket for a record of `max_entries` (0: the record is off).
pub fn bucket_capacity(max_entries: usize) -> usize {
    max_entries.min(MAX_RESPONSES).div_ceil(BUCKETS)
}

/// A bucket's entries; a value of another layout (a length that is no
/// multiple of an entry, more entries than any configuration keeps) is empty.
pub fn decode(bytes: &[u8]) -> Vec<Entry> {
    if !bytes.len().is_multiple_of(ENTRY_BYTES) || bytes.len() / ENTRY_BYTES > MAX_BUCKET_ENTRIES {
        return Vec::new();
    }
    entries(bytes)
}

/// The entries of a whole number of them.
fn entries(bytes: &[u8]) -> Vec<Entry> {
    let mut r = Reader::new(bytes);
    let mut out = Vec::with_capacity(bytes.len() / ENTRY_BYTES);
    while let (Some(id), Some(pod), Some(at_ms)) = (r.get(), r.get(), r.get()) {
        out.push(Entry { id, pod, at_ms });
    }
    out
}

/// A bucket's bytes.
pub fn encode(entries: &[Entry]) -> Vec<u8> {
    let mut out = Vec::with_capacity(entries.len() * ENTRY_BYTES);
    for e in entries {
        put(&mut out, e.id);
        put(&mut out, e.pod);
        put(&mut out, e.at_ms);
    }
    out
}

/// The entry of `id` in a bucket's bytes.
pub fn find(bytes: &[u8], id: u64) -> Option<Entry> {
    decode(bytes).into_iter().find(|e| e.id == id)
}

/// `entries` with `new` in: an entry of its id replaced, and the oldest of
/// the others dropped until at most `capacity` remain with it. `new` always
/// stays, whatever times the others claim (a bucket another writer damaged
/// or dated ahead must not make the answer just read the first to go).
pub fn insert(mut entries: Vec<Entry>, new: Entry, capacity: usize) -> Vec<Entry> {
    entries.retain(|e| e.id != new.id);
    while entries.len() >= capacity.max(1) {
        let oldest = entries
            .iter()
            .enumerate()
            .min_by_key(|(_, e)| e.at_ms)
            .map(|(i, _)| i);
        match oldest {
            Some(i) => {
                entries.remove(i);
            }
            None => break,
        }
    }
    entries.push(new);
    entries
}

/// [`insert`] of an entry a peer sent, unless the bucket knows better: an
/// entry of its id at least as new, or `capacity` entries all newer than it
/// (a peer's old answer must not push out what this gateway learnt since).
/// `None`: the bucket stays as it is.
pub fn insert_imported(entries: Vec<Entry>, new: Entry, capacity: usize) -> Option<Vec<Entry>> {
    let newer = |e: &Entry| e.at_ms >= new.at_ms;
    let known = entries.iter().any(|e| e.id == new.id && newer(e));
    let crowded = entries.iter().filter(|e| e.id != new.id).count() >= capacity.max(1)
        && entries.iter().all(newer);
    (!known && !crowded).then(|| insert(entries, new, capacity))
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn e(id: u64, pod: u64, at_ms: u64) -> Entry {
        Entry { id, pod, at_ms }
    }

    #[test]
    fn a_bucket_keeps_its_newest_entries_and_one_per_id() {
        let mut b = Vec::new();
        for i in 0..5 {
            b = insert(b, e(i, 7, 100 + i), 3);
        }
        assert_eq!(b.iter().map(|x| x.id).collect::<Vec<_>>(), vec![2, 3, 4]);
        // A newer answer of an id replaces its entry (and keeps the others).
        b = insert(b, e(3, 9, 200), 3);
        assert_eq!(b.len(), 3);
        assert_eq!(find(&encode(&b), 3), Some(e(3, 9, 200)));
        assert_eq!(find(&encode(&b), 2), Some(e(2, 7, 102)));
        assert_eq!(find(&encode(&b), 0), None);
    }

    #[test]
    fn the_answer_just_read_stays_whatever_the_others_claim() {
        // Entries dated after it (a damaged bucket, another writer's clock): one of
        // them goes, not the new entry.
        let later = vec![e(1, 7, 900), e(2, 7, 950)];
        let b = insert(later, e(3, 8, 100), 2);
        assert_eq!(b, vec![e(2, 7, 950), e(3, 8, 100)]);
        assert_eq!(
            insert(vec![e(1, 7, 900)], e(3, 8, 100), 0),
            vec![e(3, 8, 100)]
        );
    }

    #[test]
    fn a_peers_answer_never_displaces_a_newer_one() {
        let b = vec![e(1, 7, 500), e(2, 7, 600)];
        // Its id known as newer here: kept as it is.
        assert_eq!(insert_imported(b.clone(), e(1, 8, 400), 2), None);
        // Older than every entry of a full bucket: left out.
        assert_eq!(insert_imported(b.clone(), e(3, 8, 100), 2), None);
        // Newer than the oldest: in, the oldest out; a newer answer of a known id replaces it.
        assert_eq!(
            insert_imported(b.clone(), e(3, 8, 550), 2),
            Some(vec![e(2, 7, 600), e(3, 8, 550)])
        );
        assert_eq!(
            insert_imported(b.clone(), e(1, 8, 700), 2),
            Some(vec![e(2, 7, 600), e(1, 8, 700)])
        );
        // Room left: in, whatever its age.
        assert_eq!(
            insert_imported(b, e(3, 8, 100), 3).map(|b| b.len()),
            Some(3)
        );
    }

    #[test]
    fn the_recent_ring_serves_from_a_cursor_and_keeps_its_last() {
        let mut r = Recent::default();
        for i in 0..(RECENT as u64 + 10) {
            r = r.push(e(i, 7, 100 + i));
        }
        let r = Recent::decode(&r.encode());
        assert_eq!((r.next, r.entries.len()), (RECENT as u64 + 10, RECENT));
        let numbers = |since| r.since(since).map(|(n, x)| (n, x.id)).collect::<Vec<_>>();
        // Numbers and ids agree (answer i is entry i); the first ten are gone.
        assert_eq!(numbers(0).first(), Some(&(10, 10)));
        assert_eq!(numbers(RECENT as u64 + 8), vec![(264, 264), (265, 265)]);
        assert!(numbers(RECENT as u64 + 10).is_empty());
        // A cursor from an earlier life of this Envoy (past its count): the whole ring.
        assert_eq!(numbers(10_000).len(), RECENT);
    }

    #[test]
    fn a_damaged_recent_ring_reads_as_empty() {
        let r = Recent::default().push(e(1, 2, 3)).push(e(4, 5, 6));
        let good = r.encode();
        assert_eq!(Recent::decode(&good), r);
        assert_eq!(Recent::decode(&good[..good.len() - 1]), Recent::default());
        let mut more = good.clone();
        more[8] = 3; // says three entries, holds two
        assert_eq!(Recent::decode(&more), Recent::default());
        let mut behind = good;
        behind[0] = 1; // two entries kept of one answer ever
        assert_eq!(Recent::decode(&behind), Recent::default());
        assert_eq!(Recent::decode(b"xy"), Recent::default());
    }

    #[test]
    fn damaged_or_foreign_bytes_read_as_empty() {
        let good = encode(&[e(1, 2, 3)]);
        assert_eq!(decode(&good), vec![e(1, 2, 3)]);
        assert!(decode(&good[..23]).is_empty());
        assert!(decode(&[0; 25]).is_empty());
        assert!(decode(&vec![0; ENTRY_BYTES * (MAX_BUCKET_ENTRIES + 1)]).is_empty());
        assert_eq!(find(b"garbage", 1), None);
    }

    #[test]
    fn capacity_and_buckets() {
        assert_eq!(bucket_capacity(16_384), 64);
        assert_eq!(bucket_capacity(1), 1);
        assert_eq!(bucket_capacity(0), 0);
        assert_eq!(bucket_capacity(usize::MAX), MAX_BUCKET_ENTRIES);
        assert_eq!(bucket_of(u64::MAX), 255);
        assert_eq!(bucket_of(0x01ff_ffff_ffff_ffff), 1);
        assert_eq!(key(17), "warmroute.responses.v1.17");
    }
}
