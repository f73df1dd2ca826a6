//! Every stable hash warmroute computes, in one place.
//!
//! ```text
//! murmur(bytes)        = low 64 bits of murmur3_x64_128(bytes, SEED)
//! mix(x)               = splitmix64's finaliser of x
//! fold(seed, bytes)    = mix(... mix(mix(seed ^ b_0) ^ b_1) ... ^ b_n)
//! rendezvous(key, ids) = backends by descending mix(key ^ id_b), ties by index
//! ```
//! - `murmur` chains the prompt's blocks ([`crate::prompt::prefix`]);
//! - `fold` names a backend by its address (its rendezvous id), the fleet by
//!   its backends (the shared-data key space), a session by its header value;
//! - `rendezvous` (highest random weight, Thaler & Ravishankar 1998) orders
//!   the backends for a key: removing a backend moves only the keys it held,
//!   and every gateway replica computes the same order with no shared store.
//!
//! All of them are fixed functions of their input: hashes must agree across
//! worker VMs, restarts, gateway replicas and releases. Never `DefaultHasher`
//! (randomly seeded per process). The reference vectors in the tests were
//! computed independently (Python's `mmh3` and a plain-integer splitmix64),
//! so a change to any of these functions fails them.
//!
//! | constant | value | why |
//! |----------|-------|-----|
//! | `SEED` | `0x7772_6d72` ("wrmr") | fixed murmur3 seed |
//! | `ADDRESS_SEED` | `0xcbf2_9ce4_8422_2325` | FNV-1a's offset basis: any fixed odd start |
//! | `SESSION_SEED` | `0x5e55_1011` | keeps session hashes apart from address ids |
//! | `RESPONSE_SEED` | `0x7265_7370` ("resp") | a stored response's id ([`response_id`]), apart from the prompt's chain |
//!
//! Cost: murmur3 ≈ one pass over the bytes; `fold` one `mix` per byte (used on
//! short strings only); `rendezvous` O(n) expected in the backends (a bucket
//! sort of uniform weights, O(n log n) at worst), its first k (`rendezvous_top`)
//! O(n + k log k).

/// Fixed murmur3 seed ("wrmr"): hashes must be stable across processes.
pub const SEED: u32 = 0x7772_6d72;
/// Start of a backend address's fold.
pub const ADDRESS_SEED: u64 = 0xcbf2_9ce4_8422_2325;
/// Start of a session id's fold.
pub const SESSION_SEED: u64 = 0x5e55_1011;
/// murmur3 seed of a stored response's id.
pub const RESPONSE_SEED: u32 = 0x7265_7370;

/// Low 64 bits of murmur3_x64_128 of `bytes` with [`SEED`].
pub fn murmur(bytes: &[u8]) -> u64 {
    mur3::murmurhash3_x64_128(bytes, SEED).0
}

/// splitmix64: a fast, well-mixed 64-bit finaliser.
pub fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// Folds `bytes` into `seed`, one [`mix`] per byte (short strings only).
pub fn fold(seed: u64, bytes: &[u8]) -> u64 {
    bytes.iter().fold(seed, |h, &c| mix(h ^ c as u64))
}

/// A stored response's id (`/v1/responses`), hashed where it is read: the
/// record of who answered it ([`crate::fleet::responses`]) never holds a
/// client's string. Low 64 bits of murmur3_x64_128 with [`RESPONSE_SEED`].
pub fn response_id(id: &[u8]) -> u64 {
    mur3::murmurhash3_x64_128(id, RESPONSE_SEED).0
}

/// A backend's rendezvous id: its address, hashed.
pub fn address_id(address: &str) -> u64 {
    fold(ADDRESS_SEED, address.as_bytes())
}

/// A session header value, hashed.
pub fn session_hash(s: &str) -> u64 {
    fold(SESSION_SEED, s.as_bytes())
}

/// A backend's place in the rendezvous order for `key`, as one integer:
/// ascending order of these is descending weight, ties by ascending index.
fn rank(key: u64, ids: &[u64], b: usize) -> u128 {
    let weight = mix(key ^ ids.get(b).copied().unwrap_or(b as u64));
    (u128::from(!weight) << 64) | b as u128
}

/// The backend a [`rank`] stands for.
fn ranked(r: u128) -> usize {
    r as u64 as usize
}

/// Below this many backends a comparison sort beats distributing them into buckets.
const BUCKET_SORT_MIN: usize = 64;

/// Sorts ranks ascending. Weights are uniform, so one counting pass on the
/// top log2(n) bits leaves about one rank per bucket, each bucket then sorted
/// whole: O(n) expected, and never worse than the comparison sort it falls
/// back to when keys collide (ties sort within their bucket).
fn sort_ranks(v: &mut Vec<u128>) {
    if v.len() < BUCKET_SORT_MIN {
        v.sort_unstable();
        return;
    }
    let bits = (usize::BITS - v.len().leading_zeros()).min(16);
    let bucket = |r: &u128| (r >> (128 - bits)) as usize;
    let mut start = vec![0usize; (1 << bits) + 1];
    for r in v.iter() {
        start[bucket(r) + 1] += 1;
    }
    let mut sum = 0;
    for c in start.iter_mut() {
        sum += *c;
        *c = sum;
    }
    let mut next = start.clone();
    let mut out = vec![0u128; v.len()];
    for r in v.iter() {
        let slot = &mut next[bucket(r)];
        out[*slot] = *r;
        *slot += 1;
    }
    for w in start.windows(2) {
        if w[1] - w[0] > 1 {
            out[w[0]..w[1]].sort_unstable();
        }
    }
    *v = out;
}

/// Backends sorted by rendezvous (highest random weight) order for `key`:
/// one bucket sort of 128-bit ranks ([`sort_ranks`]), a third of the time of
/// sorting pairs with a comparator at 1024 backends.
pub fn rendezvous(key: u64, ids: &[u64], among: impl Iterator<Item = usize>) -> Vec<usize> {
    let mut v: Vec<u128> = among.map(|b| rank(key, ids, b)).collect();
    sort_ranks(&mut v);
    v.into_iter().map(ranked).collect()
}

/// The first `k` backends of [`rendezvous`]'s order, in O(n + k log k)
/// rather than a sort of all of them: what a request's fallbacks need.
pub fn rendezvous_top(
    key: u64,
    ids: &[u64],
    among: impl Iterator<Item = usize>,
    k: usize,
) -> Vec<usize> {
    let mut v: Vec<u128> = among.map(|b| rank(key, ids, b)).collect();
    if k == 0 {
        return Vec::new();
    }
    if k < v.len() {
        v.select_nth_unstable(k - 1);
        v.truncate(k);
    }
    v.sort_unstable();
    v.into_iter().map(ranked).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    // Reference values computed outside Rust: Python's `mmh3.hash64(b, seed,
    // signed=False)[0]` and splitmix64 on Python integers masked to 64 bits.

    #[test]
    fn murmur_is_murmur3_x64_128_low_half() {
        // The reference implementation's value for "hello" with seed 0.
        assert_eq!(
            mur3::murmurhash3_x64_128(b"hello", 0).0,
            0xcbd8_a7b3_41bd_9b02
        );
        assert_eq!(murmur(b"hello"), 0xb5d5_2a03_1c6b_6f2e);
    }

    #[test]
    fn mix_is_splitmix64() {
        // mix(0) is splitmix64's first output from state 0.
        assert_eq!(mix(0), 0xe220_a839_7b1d_cdaf);
        assert_eq!(mix(1), 0x910a_2dec_8902_5cc1);
        assert_eq!(mix(0xdead_beef), 0x4adf_b90f_68c9_eb9b);
    }

    #[test]
    fn ids_and_sessions_are_pinned() {
        assert_eq!(address_id("10.0.0.1:8000"), 0x5f04_00e5_69e9_f1b4);
        assert_eq!(session_hash("user-42"), 0x7389_448c_3da3_00b5);
        // Python's mmh3.hash64(id, 0x72657370, signed=False)[0].
        assert_eq!(
            response_id(b"resp_0123456789abcdef0123456789abcdef"),
            0x561a_0bc1_4986_6177
        );
        assert_eq!(response_id(b""), 0x81d1_b5ac_ae63_5585);
    }

    #[test]
    fn the_first_k_are_the_orders_first_k() {
        let ids: Vec<u64> = (0..300).map(|i| mix(i * 7919)).collect();
        for key in [0, 1, 0xdead_beef, u64::MAX] {
            let all = rendezvous(key, &ids, 0..300);
            // The order as first written: pairs, by descending weight then index.
            let mut pairs: Vec<(u64, usize)> = (0..300).map(|b| (mix(key ^ ids[b]), b)).collect();
            pairs.sort_unstable_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
            assert_eq!(all, pairs.iter().map(|p| p.1).collect::<Vec<_>>());
            for k in [0, 1, 2, 3, 17, 299, 300, 400] {
                let top = rendezvous_top(key, &ids, 0..300, k);
                assert_eq!(top, all[..k.min(300)], "key {key} k {k}");
            }
            // A subset keeps the relative order of the whole.
            let odd: Vec<usize> = all.iter().copied().filter(|b| b % 2 == 1).collect();
            assert_eq!(rendezvous(key, &ids, (0..300).filter(|b| b % 2 == 1)), odd);
        }
    }

    #[test]
    fn a_fleet_of_equal_weights_sorts_by_index() {
        // One id for every backend: one bucket holds them all.
        let ids = [7u64; 100];
        assert_eq!(rendezvous(1, &ids, 0..100), (0..100).collect::<Vec<_>>());
    }

    #[test]
    fn equal_weights_tie_by_index() {
        // Backends without an id weigh by their index: give two the same id instead.
        let ids = [5, 9, 5, 9];
        let order = rendezvous(3, &ids, 0..4);
        let first = if mix(3 ^ 5) > mix(3 ^ 9) {
            [0, 2, 1, 3]
        } else {
            [1, 3, 0, 2]
        };
        assert_eq!(order, first);
        assert_eq!(rendezvous_top(3, &ids, 0..4, 2), first[..2]);
    }

    #[test]
    fn rendezvous_order_is_pinned() {
        let ids: Vec<u64> = (1..=5)
            .map(|i| address_id(&format!("10.0.0.{i}:8000")))
            .collect();
        assert_eq!(
            rendezvous(0x0123_4567_89ab_cdef, &ids, 0..5),
            vec![2, 4, 1, 0, 3]
        );
        // Removing a backend moves only the keys it held: the others keep their order.
        assert_eq!(
            rendezvous(0x0123_4567_89ab_cdef, &ids, [0, 1, 3, 4].into_iter()),
            vec![4, 1, 0, 3]
        );
    }
}
