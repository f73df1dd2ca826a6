//! Self-checks of the emulator's loud-failure behaviour, with tiny inline modules
//! (no dependency on dist/warmroute.wasm).
use host_tests::*;

const BASE: &str = r#"
  (memory (export "memory") 1)
  (global $heap (mut i32) (i32.const 1024))
  (func (export "proxy_abi_version_0_2_1"))
  (func (export "proxy_on_memory_allocate") (param $n i32) (result i32)
    (local $p i32)
    (local.set $p (global.get $heap))
    (global.set $heap (i32.add (global.get $heap) (local.get $n)))
    (local.get $p))
  (func (export "proxy_on_context_create") (param i32 i32))
  (func (export "proxy_on_vm_start") (param i32 i32) (result i32) (i32.const 1))
"#;

fn module(imports: &str, body: &str) -> Vec<u8> {
    wat::parse_str(format!("(module {imports} {BASE} {body})")).unwrap()
}

#[test]
fn unknown_imports_are_listed_at_load() {
    let wasm = module(
        r#"(import "env" "proxy_made_up_call" (func (param i32)))
           (import "other" "thing" (func))"#,
        "",
    );
    let err = match Host::from_bytes(&wasm) {
        Ok(_) => panic!("loading must fail"),
        Err(e) => format!("{e:?}"),
    };
    assert!(err.contains("env::proxy_made_up_call"), "{err}");
    assert!(err.contains("other::thing"), "{err}");
}

#[test]
fn mistyped_import_fails_at_instantiate() {
    let wasm = module(r#"(import "env" "proxy_log" (func (param i64)))"#, "");
    let host = Host::from_bytes(&wasm).unwrap();
    let err = format!("{:?}", host.start_vm("").unwrap_err());
    assert!(err.contains("proxy_log"), "{err}");
}

#[test]
fn unimplemented_host_call_traps_loudly() {
    let wasm = module(
        r#"(import "env" "proxy_grpc_cancel" (func $cancel (param i32) (result i32)))"#,
        r#"(func (export "proxy_on_configure") (param i32 i32) (result i32)
             (drop (call $cancel (i32.const 7))) (i32.const 1))"#,
    );
    let host = Host::from_bytes(&wasm).unwrap();
    let err = format!("{:?}", host.start_vm("").unwrap_err());
    assert!(
        err.contains("proxy_grpc_cancel is not implemented"),
        "{err}"
    );
}

#[test]
fn plugin_config_readable_and_log_captured() {
    // proxy_on_configure reads the whole plugin configuration and logs it at level Warn.
    let wasm = module(
        r#"(import "env" "proxy_get_buffer_bytes" (func $get (param i32 i32 i32 i32 i32) (result i32)))
           (import "env" "proxy_log" (func $log (param i32 i32 i32) (result i32)))"#,
        r#"(func (export "proxy_on_configure") (param i32 i32) (result i32)
             (if (i32.ne (call $get (i32.const 7) (i32.const 0) (i32.const -1) (i32.const 16) (i32.const 20)) (i32.const 0))
               (then unreachable))
             (drop (call $log (i32.const 3) (i32.load (i32.const 16)) (i32.load (i32.const 20))))
             (i32.eq (local.get 1) (i32.load (i32.const 20))))"#,
    );
    let host = Host::from_bytes(&wasm).unwrap();
    let vm = host.start_vm("{\"hello\":1}").unwrap();
    assert!(vm.configured());
    assert!(vm.logs_contain("{\"hello\":1}"), "{}", vm.log_text());
    assert_eq!(vm.logs()[0].level, LogLevel::Warn);
    assert_eq!(vm.memory_pages(), 1);
}

#[test]
fn missing_abi_marker_is_rejected() {
    let wasm = wat::parse_str(r#"(module (memory (export "memory") 1))"#).unwrap();
    let host = Host::from_bytes(&wasm).unwrap();
    let err = format!("{:?}", host.start_vm("").unwrap_err());
    assert!(err.contains("ABI version"), "{err}");
}

#[test]
fn fuel_counts_the_guest_work_of_a_span_of_calls() {
    // Each tick runs a loop of `n` iterations, n set by the plugin configuration's size.
    let wasm = module(
        "",
        r#"(global $n (mut i32) (i32.const 0))
           (func (export "proxy_on_configure") (param i32 i32) (result i32)
             (global.set $n (local.get 1)) (i32.const 1))
           (func (export "proxy_on_tick") (param i32)
             (local $i i32)
             (loop $again
               (local.set $i (i32.add (local.get $i) (i32.const 1)))
               (br_if $again (i32.lt_u (local.get $i) (global.get $n)))))"#,
    );
    let plain = Host::from_bytes(&wasm).unwrap().start_vm("").unwrap();
    assert_eq!(plain.fuel_used(), None, "metering is opt-in");
    let metered = Host::from_bytes_with(
        &wasm,
        HostOptions {
            fuel: true,
            ..HostOptions::default()
        },
    )
    .unwrap();
    let cost = |n: usize| {
        let vm = metered.start_vm("x".repeat(n)).unwrap();
        let before = vm.fuel_used().unwrap();
        vm.tick().unwrap();
        vm.tick().unwrap();
        vm.fuel_used().unwrap() - before
    };
    let (small, large) = (cost(10), cost(1010));
    // Deterministic, and linear in the loop's iterations (a handful of instructions each).
    assert_eq!(small, cost(10));
    let per_iteration = (large - small) / 2 / 1000;
    assert!((3..=10).contains(&per_iteration), "{small} {large}");
}
