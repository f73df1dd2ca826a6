//! Every stable hash warmroute computes, in one place.
//!
//! ```text
//! murmur(bytes)        = low 64 bits of murmur3_x64_128(bytes, SEED)
//! mix(x)               = splitmix64's finaliser of x
//! fold(seed, bytes)    = mix(... mix(mix(seed ^ b_0) ^ b_1) ... ^ b_n)
//! rendezvous(key, ids) = backends by descending mix(key ^ id_b), ties by index
//! ```
//! - `murmur` chains the prompt's blocks ([`crate::prefix`]);
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
//!
//! Cost: murmur3 ≈ one pass over the bytes; `fold` one `mix` per byte (used on
//! short strings only); `rendezvous` O(n log n) in the backends.

/// Fixed murmur3 seed ("wrmr"): hashes must be stable across processes.
pub const SEED: u32 = 0x7772_6d72;
/// Start of a backend address's fold.
pub const ADDRESS_SEED: u64 = 0xcbf2_9ce4_8422_2325;
/// Start of a session id's fold.
pub const SESSION_SEED: u64 = 0x5e55_1011;

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

/// A backend's rendezvous id: its address, hashed.
pub fn address_id(address: &str) -> u64 {
    fold(ADDRESS_SEED, address.as_bytes())
}

/// A session header value, hashed.
pub fn session_hash(s: &str) -> u64 {
    fold(SESSION_SEED, s.as_bytes())
}

/// Backends sorted by rendezvous (highest random weight) order for `key`.
pub fn rendezvous(key: u64, ids: &[u64], among: impl Iterator<Item = usize>) -> Vec<usize> {
    let mut v: Vec<(u64, usize)> = among
        .map(|b| (mix(key ^ ids.get(b).copied().unwrap_or(b as u64)), b))
        .collect();
    v.sort_unstable_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    v.into_iter().map(|(_, b)| b).collect()
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
