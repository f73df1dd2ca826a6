//! A pod's `/metrics` reply → Prometheus samples → the gauges routing uses.
//! Invariants: no panic; bounded allocation; values clamped to their meaning.
#![no_main]

use fuzz_support::bounded;
use libfuzzer_sys::fuzz_target;
use warmroute_core::fleet::prometheus;
use warmroute_core::fleet::scrape::extract;

fuzz_target!(|data: &[u8]| {
    let names = warmroute_core::testing::config(1).metrics.names;
    let text = String::from_utf8_lossy(data);
    bounded(data.len(), || {
        let mut n = 0usize;
        let stats = prometheus::parse(&text, |_| n += 1);
        assert_eq!(stats.samples, n);
        let s = extract(&text, &names, None);
        assert!(s.running >= 0.0 && s.waiting >= 0.0);
        assert!((0.0..=1.0).contains(&s.kv_usage));
        let _ = extract(&text, &names, Some("m"));
    });
});
