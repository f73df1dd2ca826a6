//! Plugin configuration bytes → `Config::parse`, as `on_configure` runs it.
//! Invariants: no panic; bounded allocation; a rejection names a field.
#![no_main]

use fuzz_support::bounded;
use libfuzzer_sys::fuzz_target;
use warmroute_core::config::Config;

fuzz_target!(|data: &[u8]| {
    if let Err(e) = bounded(data.len(), || Config::parse(data)) {
        assert!(!e.field.is_empty(), "{e}");
    }
});
