//! Envoy's admin `/clusters?format=json` reply → the pool's endpoints, for a
//! fuzzed set of pool clusters (an Envoy that ignores `filter` lists other
//! clusters too, which are skipped), then into a slot table as the VM holding
//! the scrape lease does.
//! Input: a selector (bits 0-3: which of four cluster names are the pool's,
//! none meaning the first; bits 4-6: slots 1..=8), then the reply.
//! Invariants: no panic; bounded allocation; the endpoints are sorted by
//! address, each once, each in one of the pool's clusters, written `ip:port`;
//! they are those of each pool cluster read alone, a pod listed in two
//! counting in the first; a slot table they are assigned to round-trips.
#![no_main]

use fuzz_support::bounded;
use libfuzzer_sys::fuzz_target;
use warmroute_core::fleet::membership::{parse_endpoints, ReplyError, Slots, MAX_REPLY_BYTES};

const NAMES: [&str; 4] = [
    "pool",
    "llama",
    "qwen.x",
    "outbound|8000||vllm.llm.svc.cluster.local",
];

fuzz_target!(|data: &[u8]| {
    let Some((&sel, body)) = data.split_first() else {
        return;
    };
    let mut clusters: Vec<&str> = (0..4)
        .filter(|i| sel >> i & 1 == 1)
        .map(|i| NAMES[i])
        .collect();
    if clusters.is_empty() {
        clusters.push(NAMES[0]);
    }
    let n = 1 + usize::from(sel >> 4 & 7);
    bounded(body.len(), || check(body, &clusters, n));
});

fn check(body: &[u8], clusters: &[&str], n: usize) {
    let got = parse_endpoints(body, clusters);
    assert_eq!(
        body.len() > MAX_REPLY_BYTES,
        got == Err(ReplyError::TooLarge)
    );
    let Ok((endpoints, _others)) = got else {
        return;
    };
    for w in endpoints.windows(2) {
        assert!(w[0].address < w[1].address, "not sorted, or twice: {w:?}");
    }
    for e in &endpoints {
        assert!(usize::from(e.cluster) < clusters.len());
        let (_, port) = e.address.rsplit_once(':').expect("no port");
        assert!(port.parse::<u32>().is_ok(), "{}", e.address);
    }
    // Each cluster read alone gives its own endpoints; together, a pod in two
    // clusters counts in the first.
    let mut merged = Vec::new();
    for (i, c) in clusters.iter().enumerate() {
        match parse_endpoints(body, &[c]) {
            Ok((mut alone, _)) => {
                alone.iter_mut().for_each(|e| e.cluster = i as u16);
                merged.extend(alone);
            }
            Err(ReplyError::WrongClusters) => {}
            Err(e) => panic!("{c} alone: {e:?}, together: read"),
        }
    }
    merged.sort_by(|a, b| a.address.cmp(&b.address).then(a.cluster.cmp(&b.cluster)));
    merged.dedup_by(|a, b| a.address == b.address);
    assert_eq!(merged, endpoints);

    let mut s = Slots::empty(n);
    let changes = s.assign(&endpoints, 1);
    assert_eq!(changes.joined.len() + changes.unplaced, endpoints.len());
    assert_eq!(Slots::decode(&s.encode(), n), Some(s));
}
