use super::*;
#[cfg(target_arch = "wasm32")]
use wasm_bindgen_test::wasm_bindgen_test as test;

const MIN: &str =
    r#"{"backends":[{"name":"a","address":"127.0.0.1:1"},{"name":"b","address":"127.0.0.1:2"}]}"#;

fn err(json: &str) -> ConfigError {
    match Config::parse(json.as_bytes()) {
        Ok(c) => panic!("accepted {json}: {c:?}"),
        Err(e) => e,
    }
}

#[test]
fn minimal_config_gets_defaults() {
    let c = Config::parse(MIN.as_bytes()).unwrap();
    assert_eq!(c.strategy, Strategy::CacheAware);
    assert_eq!(c.route.mode, RouteMode::Endpoint);
    assert_eq!(c.route.header, ENDPOINT_HEADER);
    assert_eq!(c.block_bytes, 256);
    assert_eq!(c.backends[1].host, "127.0.0.1:2");
    assert_eq!(c.backends[0].metrics_path, "/metrics");
    assert!(c.metrics.enabled);
    assert_eq!(c.metrics.period_ms, 500);
}

#[test]
fn header_mode_defaults_its_header() {
    let c = Config::parse(
        br#"{"backends":[{"name":"a","address":"127.0.0.1:1"}],"route":{"mode":"header"}}"#,
    )
    .unwrap();
    assert_eq!(c.route.header, BACKEND_HEADER);
}

#[test]
fn unknown_field_is_named() {
    let e = err(r#"{"backends":[{"name":"a","address":"127.0.0.1:1"}],"stratgy":"random"}"#);
    assert_eq!(e.field, "stratgy");
}

#[test]
fn an_unknown_empty_key_is_placed() {
    // Found by the config fuzz target: the field named was "" (then, for a key
    // of dots, the dots trimmed away).
    let e = err(r#"{"backends":[{"name":"a","address":"127.0.0.1:1"}],"":1}"#);
    assert!(e.field.starts_with("line 1 column"), "{e}");
    let nested = err(r#"{"backends":[{"name":"a","address":"127.0.0.1:1"}],"metrics":{"":1}}"#);
    assert_eq!(nested.field, "metrics");
    let dots = err(r#"{"backends":[{"name":"a","address":"127.0.0.1:1"}],"...":1}"#);
    assert_eq!(dots.field, "...");
}

#[test]
fn unknown_nested_field_is_named() {
    let e = err(r#"{"backends":[{"name":"a","address":"127.0.0.1:1","weight":3}]}"#);
    assert_eq!(e.field, "backends[0].weight");
    let t = err(
        r#"{"backends":[{"name":"a","address":"127.0.0.1:1"}],"metrics":{"period_ms":"fast"}}"#,
    );
    assert_eq!(t.field, "metrics.period_ms");
}

#[test]
fn bad_strategy_is_rejected() {
    let e = err(r#"{"backends":[{"name":"a","address":"127.0.0.1:1"}],"strategy":"fastest"}"#);
    assert!(e.problem.contains("unknown variant"), "{e}");
    assert_eq!(e.field, "strategy");
}

#[test]
fn missing_backends_is_named() {
    assert_eq!(err("{}").field, "backends");
    assert_eq!(err(r#"{"backends":[]}"#).field, "backends");
}

#[test]
fn bad_address_is_named() {
    let e = err(r#"{"backends":[{"name":"a","address":"vllm-0:8000"}]}"#);
    assert_eq!(e.field, "backends[0].address");
}

#[test]
fn duplicate_name_is_named() {
    let e = err(
        r#"{"backends":[{"name":"a","address":"127.0.0.1:1"},{"name":"a","address":"127.0.0.1:2"}]}"#,
    );
    assert_eq!(e.field, "backends[1].name");
}

#[test]
fn out_of_range_values_are_named() {
    let base = r#"{"backends":[{"name":"a","address":"127.0.0.1:1"}],"#;
    for (fields, named) in [
        (r#""block_bytes":4"#, "block_bytes"),
        (r#""balance":{"eps":-1}"#, "balance.eps"),
        (r#""balance":{"warm_min_cap":0}"#, "balance.warm_min_cap"),
        (
            r#""cache_aware":{"replicate_gap":0.5}"#,
            "cache_aware.replicate_gap",
        ),
        (
            r#""cache_aware":{"prefill_slack_tokens":99999999}"#,
            "cache_aware.prefill_slack_tokens",
        ),
        (
            r#""metrics":{"period_ms":100,"timeout_ms":200}"#,
            "metrics.timeout_ms",
        ),
        (r#""metrics":{"healthy_after":0}"#, "metrics.healthy_after"),
        (r#""balance":{"decode_cost":-1}"#, "balance.decode_cost"),
        (
            r#""balance":{"default_output_tokens":0}"#,
            "balance.default_output_tokens",
        ),
        (r#""pool":{}"#, "pool"),
        (
            r#""route":{"model_header":"x-gateway-destination-endpoint"}"#,
            "route.model_header",
        ),
        (
            r#""metrics":{"eject_after_errors":5000}"#,
            "metrics.eject_after_errors",
        ),
        (
            r#""saturation":{"max_kv_usage":1.5}"#,
            "saturation.max_kv_usage",
        ),
        (r#""route":{"header":"bad header"}"#, "route.header"),
        (r#""debug_match_counts":true"#, "debug_match_counts"),
        (
            r#""feedback":{"enabled":false,"request_usage":true}"#,
            "feedback.request_usage",
        ),
        // Sizes past what a wasm32 VM can hold.
        (r#""max_body_bytes":1073741824"#, "max_body_bytes"),
        (r#""index":{"max_blocks":67108864}"#, "index.max_blocks"),
        (r#""index":{"log_bytes":67108864}"#, "index.log_bytes"),
        (
            r#""responses":{"max_entries":262145}"#,
            "responses.max_entries",
        ),
        (r#""responses":{"max_entries":-1}"#, "responses.max_entries"),
    ] {
        assert_eq!(err(&format!("{base}{fields}}}")).field, named, "{fields}");
    }
}

#[test]
fn not_json_is_rejected() {
    let e = err("strategy: random");
    assert!(e.field.starts_with("line 1"), "{e}");
    let t = err(r#"{"backends":[{"name":"a","address":"127.0.0.1:1"}]} trailing"#);
    assert!(t.problem.contains("trailing"), "{t}");
}

#[test]
fn a_gate_needs_a_knee_and_names_its_classes() {
    let base = r#"{"backends":[{"name":"a","address":"127.0.0.1:1"}],"gate":"#;
    let g = Config::parse(format!(r#"{base}{{"knee":{{"requests":8}}}}}}"#).as_bytes())
        .unwrap()
        .gate
        .unwrap();
    let names: Vec<&str> = g.classes.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, vec!["interactive", "standard", "batch"]);
    assert_eq!(g.default_class, 1);
    assert_eq!(g.class_header, "x-warmroute-priority");
    assert!(g.objectives.is_empty());
    let mapped = Config::parse(
        format!(r#"{base}{{"knee":{{"requests":8}},"objectives":{{"premium":"Interactive","bulk":"batch"}}}}}}"#)
            .as_bytes(),
    )
    .unwrap()
    .gate
    .unwrap();
    assert_eq!(
        mapped.objectives,
        vec![("bulk".to_string(), 2), ("premium".to_string(), 0)]
    );
    for (gate, named) in [
        (r#"{}"#, "gate.knee"),
        (r#"{"knee":{"requests":0}}"#, "gate.knee.requests"),
        (r#"{"knee":{"kv_usage":2}}"#, "gate.knee.kv_usage"),
        (r#"{"knee":{"requests":4},"classes":[]}"#, "gate.classes"),
        (
            r#"{"knee":{"requests":4},"objectives":{"premium":"gold"}}"#,
            "gate.objectives.premium",
        ),
        (
            r#"{"knee":{"requests":4},"default_class":"gold"}"#,
            "gate.default_class",
        ),
        (
            r#"{"knee":{"requests":4},"default_class":"a","classes":[{"name":"a","max_wait_ms":1,"max_queue":1},{"name":"b","aliases":["A"],"max_wait_ms":1,"max_queue":1}]}"#,
            "gate.classes[1].name",
        ),
        (
            r#"{"knee":{"requests":4},"default_class":"a","classes":[{"name":"a","max_wait_ms":0,"max_queue":1}]}"#,
            "gate.classes[0].max_wait_ms",
        ),
        (r#"{"knee":{"requests":4},"check_ms":1}"#, "gate.check_ms"),
        (r#"{"knee":{"requests":4},"header":"a b"}"#, "gate.header"),
        (
            r#"{"knee":{"requests":4},"lower_share":0.7}"#,
            "gate.lower_share",
        ),
    ] {
        assert_eq!(err(&format!("{base}{gate}}}")).field, named, "{gate}");
    }
    let unscraped = r#"{"backends":[{"name":"a","address":"127.0.0.1:1"}],"metrics":{"enabled":false},"gate":{"knee":{"waiting":1}}}"#;
    assert_eq!(err(unscraped).field, "gate.knee");
}

#[test]
fn a_pool_is_one_cluster_or_several() {
    let one = Config::parse(br#"{"pool":{"models":["m"]}}"#).unwrap();
    let p = one.pool.unwrap();
    assert_eq!(p.clusters.len(), 1);
    assert_eq!((p.clusters[0].name.as_str(), p.max_backends), ("pool", 64));
    assert_eq!(p.clusters[0].serves.models, vec!["m".to_string()]);
    let two = Config::parse(
            br#"{"pool":{"clusters":[{"cluster":"llama","models":["l"]},{"cluster":"qwen","models":["q"],"adapters":["a"]}]}}"#,
        )
        .unwrap();
    let names: Vec<&str> = two
        .pool
        .as_ref()
        .unwrap()
        .clusters
        .iter()
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(names, vec!["llama", "qwen"]);
    assert_eq!(two.slot_count(), 64);
    for (json, field) in [
        (
            r#"{"pool":{"cluster":"a","clusters":[{"cluster":"b"}]}}"#,
            "pool.clusters",
        ),
        (
            r#"{"pool":{"clusters":[{"cluster":"b"},{"cluster":"b"}]}}"#,
            "pool.clusters[1].cluster",
        ),
        (
            r#"{"pool":{"clusters":[{"cluster":"b","modls":[]}]}}"#,
            "pool.clusters[0].modls",
        ),
        (r#"{"pool":{"models":[""]}}"#, "pool.models"),
        (
            r#"{"backends":[{"name":"a","address":"127.0.0.1:1"}],"pool":{}}"#,
            "pool",
        ),
    ] {
        assert_eq!(err(json).field, field, "{json}");
    }
}

#[test]
fn the_engine_preset_picks_the_metric_names() {
    let vllm = Config::parse(MIN.as_bytes()).unwrap().metrics;
    assert_eq!(vllm.names, Engine::Vllm.names());
    assert_eq!(vllm.names.cache_config, ["vllm:cache_config_info"]);
    assert_eq!(vllm.capacity_tokens, None);
    let llama = Config::parse(
        br#"{"backends":[{"name":"a","address":"127.0.0.1:1"}],
            "metrics":{"engine":"llamacpp","capacity_tokens":12288}}"#,
    )
    .unwrap()
    .metrics;
    assert_eq!(llama.names.running, ["llamacpp:requests_processing"]);
    assert_eq!(llama.names.waiting, ["llamacpp:requests_deferred"]);
    assert!(llama.names.kv_usage.is_empty() && llama.names.cache_config.is_empty());
    assert_eq!(llama.capacity_tokens, Some(12288));
    // A list given replaces the preset's for that quantity only.
    let mixed = Config::parse(
        br#"{"backends":[{"name":"a","address":"127.0.0.1:1"}],
            "metrics":{"engine":"llamacpp","names":{"kv_usage":["llamacpp:kv_cache_usage_ratio"]}}}"#,
    )
    .unwrap()
    .metrics;
    assert_eq!(mixed.names.kv_usage, ["llamacpp:kv_cache_usage_ratio"]);
    assert_eq!(mixed.names.running, ["llamacpp:requests_processing"]);
}

#[test]
fn bad_metric_names_and_engines_are_named() {
    let with = |metrics: &str| {
        err(&format!(
            r#"{{"backends":[{{"name":"a","address":"127.0.0.1:1"}}],"metrics":{metrics}}}"#
        ))
        .field
    };
    assert_eq!(with(r#"{"engine":"sglang"}"#), "metrics.engine");
    assert_eq!(
        with(r#"{"engine":"llamacpp","model_name":"tiny"}"#),
        "metrics.model_name"
    );
    assert_eq!(with(r#"{"engine":3}"#), "metrics.engine");
    assert_eq!(with(r#"{"names":{"running":[]}}"#), "metrics.names.running");
    assert_eq!(
        with(r#"{"engine":"llamacpp","names":{"waiting":[""]}}"#),
        "metrics.names.waiting"
    );
    assert_eq!(
        with(r#"{"names":{"kv_usage":[""]}}"#),
        "metrics.names.kv_usage"
    );
    assert_eq!(
        with(r#"{"names":{"cache_config":["a",""]}}"#),
        "metrics.names.cache_config"
    );
    assert_eq!(with(r#"{"names":{"slots":["x"]}}"#), "metrics.names.slots");
    assert_eq!(with(r#"{"capacity_tokens":0}"#), "metrics.capacity_tokens");
    assert_eq!(
        with(r#"{"capacity_tokens":2000000000000}"#),
        "metrics.capacity_tokens"
    );
    // Empty lists are fine where an engine may publish nothing.
    assert!(Config::parse(
        br#"{"backends":[{"name":"a","address":"127.0.0.1:1"}],"metrics":{"names":{"kv_usage":[],"cache_config":[]}}}"#
    )
    .is_ok());
}

#[test]
fn a_prompt_cache_is_llamacpps_and_each_bad_field_is_named() {
    let with = |metrics: &str| {
        Config::parse(
            format!(
                r#"{{"backends":[{{"name":"a","address":"127.0.0.1:1"}}],"metrics":{metrics}}}"#
            )
            .as_bytes(),
        )
    };
    let field = |metrics: &str| with(metrics).unwrap_err().field;
    let ok = with(r#"{"engine":"llamacpp","prompt_cache":{"slots":2,"ram_tokens":2048}}"#)
        .unwrap()
        .metrics;
    assert_eq!(
        ok.prompt_cache,
        Some(PromptCache {
            slots: 2,
            ram_tokens: 2048
        })
    );
    assert_eq!(with("{}").unwrap().metrics.prompt_cache, None);
    for (metrics, named) in [
        (
            r#"{"prompt_cache":{"slots":2,"ram_tokens":2048}}"#,
            "metrics.prompt_cache",
        ),
        (
            r#"{"engine":"llamacpp","prompt_cache":{"ram_tokens":2048}}"#,
            "metrics.prompt_cache.slots",
        ),
        (
            r#"{"engine":"llamacpp","prompt_cache":{"slots":2}}"#,
            "metrics.prompt_cache.ram_tokens",
        ),
        (
            r#"{"engine":"llamacpp","prompt_cache":{"slots":0,"ram_tokens":0}}"#,
            "metrics.prompt_cache.slots",
        ),
        (
            r#"{"engine":"llamacpp","prompt_cache":{"slots":5000,"ram_tokens":0}}"#,
            "metrics.prompt_cache.slots",
        ),
        (
            r#"{"engine":"llamacpp","prompt_cache":{"slots":1,"ram_tokens":2000000000000}}"#,
            "metrics.prompt_cache.ram_tokens",
        ),
        (
            r#"{"engine":"llamacpp","prompt_cache":{"slots":-1,"ram_tokens":0}}"#,
            "metrics.prompt_cache.slots",
        ),
        (
            r#"{"engine":"llamacpp","prompt_cache":{"slots":1,"ram_tokens":0,"ram_mib":8}}"#,
            "metrics.prompt_cache.ram_mib",
        ),
        (
            r#"{"engine":"llamacpp","prompt_cache":2}"#,
            "metrics.prompt_cache",
        ),
    ] {
        assert_eq!(field(metrics), named, "{metrics}");
    }
}
