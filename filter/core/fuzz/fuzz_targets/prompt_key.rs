//! Request body → prompt key, for every endpoint and a range of block sizes.
//! Invariants: no panic; bounded allocation; only full blocks are hashed; the
//! anchor lies inside the prompt; a key is the one serde_json's reading
//! (`openai::reference`) gives. The same bytes read as a `/v1/responses`
//! answer: an id its first half names is the one the whole names.
#![no_main]

use fuzz_support::bounded;
use libfuzzer_sys::fuzz_target;
use warmroute_core::prompt::openai::answer::{scan, Scan};
use warmroute_core::prompt::openai::{prompt_key, reference, Endpoint};

fuzz_target!(|data: &[u8]| {
    let Some((&sel, body)) = data.split_first() else {
        return;
    };
    let endpoint = match sel % 4 {
        0 => Endpoint::Chat,
        1 => Endpoint::Completions,
        2 => Endpoint::Responses,
        _ => Endpoint::Messages,
    };
    let block = 16usize << (sel as usize / 4 % 5);
    let key = bounded(body.len(), || prompt_key(endpoint, body, block, 2048));
    if let Ok(k) = &key {
        assert_eq!(k.blocks.len(), k.total_bytes / block);
        assert!(k.anchor_offset <= k.total_bytes);
        assert!(k.history_bytes <= k.total_bytes);
        // Every key is the one serde_json's reading gives. (serde reads some
        // bodies this reader refuses: a struct given as an array of its
        // fields, a value it skips nested past json::MAX_DEPTH or holding
        // invalid UTF-8.)
        assert_eq!(
            Ok(k),
            reference::prompt_key(endpoint, body, block, 2048).as_ref()
        );
    }
    let half = bounded(body.len(), || scan(&body[..body.len() / 2], false));
    if let Scan::Id(id) = half {
        assert_eq!(scan(body, true), Scan::Id(id));
    }
});
