//! Request body → prompt key, for every endpoint and a range of block sizes.
//! Invariants: no panic; bounded allocation; only full blocks are hashed; the
//! anchor lies inside the prompt.
#![no_main]

use fuzz_support::bounded;
use libfuzzer_sys::fuzz_target;
use warmroute_core::openai::{prompt_key, Endpoint};

fuzz_target!(|data: &[u8]| {
    let Some((&sel, body)) = data.split_first() else {
        return;
    };
    let endpoint = match sel % 3 {
        0 => Endpoint::Chat,
        1 => Endpoint::Completions,
        _ => Endpoint::Responses,
    };
    let block = 16usize << (sel as usize / 3 % 5);
    if let Ok(k) = bounded(body.len(), || prompt_key(endpoint, body, block, 2048)) {
        assert_eq!(k.blocks.len(), k.total_bytes / block);
        assert!(k.anchor_offset <= k.total_bytes);
        assert!(k.history_bytes <= k.total_bytes);
    }
});
