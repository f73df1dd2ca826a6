//! Configuration: valid configs start; each class of bad config is rejected with an error
//! log line naming the field.

use crate::common::*;
use host_tests::*;
use serde_json::json;

#[test]
fn minimal_config_starts() {
    let h = host();
    let vm = h
        .start_vm(r#"{"backends":[{"name":"a","address":"10.0.0.1:8000"}]}"#)
        .unwrap();
    assert!(vm.vm_started());
    assert!(vm.configured(), "{}", vm.log_text());
    assert!(
        vm.logs_matching(LogLevel::Error, "").is_empty(),
        "{}",
        vm.log_text()
    );
}

#[test]
fn full_contract_example_starts() {
    let cfg = json!({
      "backends": [
        {"name": "vllm-0", "address": "10.0.0.5:8000", "host": "vllm-0.vllm.ns.svc:8000", "metrics_path": "/metrics"},
        {"name": "vllm-1", "address": "10.0.0.6:8000"}
      ],
      "strategy": "cache_aware",
      "route": {"mode": "endpoint", "header": "x-gateway-destination-endpoint", "fallbacks": 2},
      "block_bytes": 256,
      "max_body_bytes": 8388608,
      "session_header": "x-session-id",
      "balance": {"eps": 0.25},
      "cache_aware": {"tie_margin": 0.05, "min_match_blocks": 1},
      "saturation": {"max_waiting": 4, "max_kv_usage": 0.98, "max_inflight": 0},
      "index": {"max_blocks": 262144, "ttl_ms": 600000, "log_bytes": 262144},
      "metrics": {"enabled": true, "cluster": "pool", "path": "/metrics", "period_ms": 500, "timeout_ms": 400,
                  "unhealthy_after": 2, "stale_after_ms": 2000, "model_name": null,
                  "names": {"running": ["vllm:num_requests_running","sglang:num_running_reqs"],
                            "waiting": ["vllm:num_requests_waiting","sglang:num_queue_reqs"],
                            "kv_usage": ["vllm:kv_cache_usage_perc","vllm:gpu_cache_usage_perc","sglang:token_usage"]}},
      "debug_header": false
    });
    let h = host();
    let vm = start(&h, &cfg.to_string());
    assert_eq!(
        vm.tick_period_ms(),
        500,
        "metrics.period_ms should set the tick period"
    );
}

#[test]
fn every_strategy_and_mode_is_accepted() {
    let h = host();
    for s in [
        "cache_aware",
        "prefix_hash",
        "least_request",
        "round_robin",
        "random",
        "sticky_session",
    ] {
        for m in ["endpoint", "header", "authority"] {
            start(&h, &config(2, json!({"strategy": s, "route": {"mode": m}})));
        }
    }
}

/// Each bad config: on_configure false, and an Error log saying "invalid configuration"
/// that names `field`.
fn rejected(cfg: &str, field: &str) {
    let h = host();
    let vm = h
        .start_vm(cfg)
        .unwrap_or_else(|e| panic!("bad config must not trap the VM: {e:?}"));
    assert!(
        !vm.configured(),
        "on_configure accepted a bad config: {cfg}\n{}",
        vm.log_text()
    );
    let errors = vm.logs_matching(LogLevel::Error, "invalid configuration");
    assert!(
        !errors.is_empty(),
        "no `invalid configuration` error log for {cfg}:\n{}",
        vm.log_text()
    );
    assert!(
        errors.iter().any(|l| l.message.contains(field)),
        "the error log does not name `{field}` for {cfg}:\n{}",
        vm.log_text()
    );
}

#[test]
fn unknown_top_level_field_is_rejected() {
    rejected(&config(1, json!({"bogus_field": 1})), "bogus_field");
}

#[test]
fn unknown_nested_field_is_rejected() {
    rejected(
        &config(1, json!({"route": {"mode": "endpoint", "headr": "x"}})),
        "headr",
    );
    rejected(
        r#"{"backends":[{"name":"a","address":"10.0.0.1:8000","weight":3}]}"#,
        "weight",
    );
}

#[test]
fn bad_strategy_is_rejected() {
    rejected(&config(1, json!({"strategy": "fastest"})), "strategy");
}

#[test]
fn bad_route_mode_is_rejected() {
    rejected(&config(1, json!({"route": {"mode": "teleport"}})), "mode");
}

#[test]
fn no_backends_is_rejected() {
    rejected(r#"{"backends":[]}"#, "backends");
    rejected(r#"{"strategy":"round_robin"}"#, "backends");
}

#[test]
fn bad_address_is_rejected() {
    rejected(
        r#"{"backends":[{"name":"a","address":"not-an-address"}]}"#,
        "address",
    );
    rejected(
        r#"{"backends":[{"name":"a","address":"10.0.0.1"}]}"#,
        "address",
    );
    rejected(
        r#"{"backends":[{"name":"a","address":"10.0.0.1:8000"},{"name":"b","address":"10.0.0.2:99999"}]}"#,
        "address",
    );
}

#[test]
fn bad_backend_name_is_rejected() {
    rejected(
        r#"{"backends":[{"name":"a b/c","address":"10.0.0.1:8000"}]}"#,
        "name",
    );
    rejected(
        r#"{"backends":[{"name":"","address":"10.0.0.1:8000"}]}"#,
        "name",
    );
}

#[test]
fn duplicate_names_are_rejected() {
    rejected(
        r#"{"backends":[{"name":"a","address":"10.0.0.1:8000"},{"name":"a","address":"10.0.0.2:8000"}]}"#,
        "name",
    );
}

#[test]
fn out_of_range_numbers_are_rejected() {
    rejected(&config(1, json!({"block_bytes": 8})), "block_bytes");
    rejected(&config(1, json!({"block_bytes": 65537})), "block_bytes");
    rejected(&config(1, json!({"block_bytes": -1})), "block_bytes");
}

#[test]
fn too_many_backends_are_rejected() {
    rejected(&config(1025, json!({})), "backends");
}

#[test]
fn wrong_type_is_rejected() {
    rejected(&config(1, json!({"block_bytes": "256"})), "block_bytes");
    rejected(&config(1, json!({"debug_header": "yes"})), "debug_header");
}

#[test]
fn not_json_is_rejected() {
    for cfg in [
        "{not json",
        "",
        "null",
        "[]",
        "\"backends\"",
        "{\"backends\":[{\"name\":\"a\",\"address\":\"10.0.0.1:8000\"}]} trailing",
    ] {
        let h = host();
        let vm = h
            .start_vm(cfg)
            .unwrap_or_else(|e| panic!("bad config must not trap: {e:?}"));
        assert!(!vm.configured(), "accepted {cfg:?}");
        assert!(
            !vm.logs_matching(LogLevel::Error, "invalid configuration")
                .is_empty(),
            "no error log for {cfg:?}:\n{}",
            vm.log_text()
        );
    }
}

#[test]
fn invalid_utf8_config_is_rejected_without_trap() {
    let h = host();
    let vm = h
        .start_vm(b"{\"backends\":[{\"name\":\"\xff\xfe\",\"address\":\"10.0.0.1:8000\"}]}")
        .unwrap();
    assert!(!vm.configured());
}
