//! Command-line flags of `warmroute-sim` (clap derive), shared with the loadgen/bench so they can
//! embed a simulated replica with the same knobs.
//!
//! Defaults resemble Llama-3.1-8B in bf16 on one H100 80 GB under vLLM:
//! * prefill ~0.06 ms per uncached prompt token (~16k tok/s of prefill);
//! * a decode step costs 12 ms plus 0.15 ms per running sequence (weights read once per step,
//!   plus per-sequence attention/KV reads);
//! * ~400k tokens of KV cache (25000 blocks of 16 tokens);
//! * vLLM's scheduler limits: 8192 batched tokens per step, 256 running sequences.
//!
//! The LoRA flags are vLLM's (`vllm/engine/arg_utils.py`, `vllm/config/lora.py`,
//! `vllm/entrypoints/openai/cli_args.py`): `--enable-lora`, `--max-loras` (default 1, at least 1)
//! and `--lora-modules` in both of vLLM's forms. `--allow-runtime-lora-updating` stands for vLLM's
//! environment variable `VLLM_ALLOW_RUNTIME_LORA_UPDATING`.

use clap::Parser;
use serde_json::Value;

use crate::engine::EngineConfig;

/// Simulated vLLM server (OpenAI-compatible API, vLLM metrics, prefix cache, continuous batching).
///
/// A flag given twice takes its last value, so wrappers can append overrides.
#[derive(Debug, Clone, Parser)]
#[command(name = "warmroute-sim", version, about, args_override_self = true)]
pub struct Args {
    /// Address to bind. Loopback by default: the simulator is for local fleets and tests.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on (0 = pick a free port; the chosen address is printed on stdout).
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    /// Replica name, returned in the `x-sim-replica` header. Default: `sim-<port>`.
    #[arg(long)]
    pub name: Option<String>,
    /// The model (vLLM's `--model`): the `root` of the base model in `/v1/models`, and its only
    /// served name unless `--served-model-name` is given. Requests naming a model the server does
    /// not serve get a 404.
    #[arg(long, default_value = "sim-llama-8b")]
    pub model: String,
    /// Names the base model is served under, instead of `--model` (vLLM's
    /// `--served-model-name`, which takes several). Each answers and has its own `/v1/models`
    /// entry; the first is the `model_name` label of every metric (vLLM's
    /// `get_served_model_name` keeps the first of the list).
    #[arg(long, num_args = 1.., value_name = "NAME")]
    pub served_model_name: Vec<String>,
    /// Tokens per KV-cache block.
    #[arg(long, default_value_t = 16)]
    pub block_size: usize,
    /// KV-cache capacity in tokens (num_gpu_blocks = this / block_size).
    #[arg(long, default_value_t = 400_000)]
    pub kv_capacity_tokens: usize,
    /// Maximum sequences running in one batch.
    #[arg(long, default_value_t = 256)]
    pub max_num_seqs: usize,
    /// Per-step token budget (chunked prefill + one token per decoding sequence).
    #[arg(long, default_value_t = 8192)]
    pub max_num_batched_tokens: usize,
    /// Maximum prompt + completion length of one request; longer requests get a 400.
    #[arg(long, default_value_t = 131_072)]
    pub max_model_len: usize,
    /// Fixed cost of one engine step, simulated milliseconds.
    #[arg(long, default_value_t = 12.0)]
    pub base_ms: f64,
    /// Cost per uncached prompt token prefilled in a step, simulated milliseconds.
    #[arg(long, default_value_t = 0.06)]
    pub prefill_ms_per_token: f64,
    /// Cost per running sequence in a step, simulated milliseconds.
    #[arg(long, default_value_t = 0.15)]
    pub decode_ms_per_seq: f64,
    /// Simulated time runs this many times faster than wall time.
    #[arg(long, default_value_t = 1.0)]
    pub time_scale: f64,
    /// Default completion length when a request sets neither max_tokens nor max_completion_tokens.
    #[arg(long, default_value_t = 16)]
    pub default_max_tokens: usize,
    /// Export `vllm:cache_config_info` (on by default; `--cache-config-info false` to hide it).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub cache_config_info: bool,
    /// Answer `/metrics` this many wall-clock milliseconds late (a pod whose
    /// metrics handler is slow under load while it still serves requests).
    #[arg(long, default_value_t = 0)]
    pub metrics_delay_ms: u64,
    /// Serve LoRA adapters: requests may name an adapter of `--lora-modules` (or one loaded at
    /// run time) as their `model`, and `/metrics` exports `vllm:lora_requests_info`.
    #[arg(long)]
    pub enable_lora: bool,
    /// Most distinct adapters in one running batch; a request for another adapter waits.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_loras: u64,
    /// Adapters served from start: `name=path`, or JSON
    /// `{"name": .., "path": .., "base_model_name": ..}` (the parent in `/v1/models`; a name that
    /// is not served falls back to the first served name, as in vLLM).
    #[arg(long, num_args = 1.., value_name = "MODULE", value_parser = parse_lora_module)]
    pub lora_modules: Vec<LoraModule>,
    /// Enable `POST /v1/load_lora_adapter` and `POST /v1/unload_lora_adapter` (what vLLM does
    /// when `VLLM_ALLOW_RUNTIME_LORA_UPDATING` is set).
    #[arg(long)]
    pub allow_runtime_lora_updating: bool,
    /// Fault: every completion response (JSON or SSE) stalls this many wall-clock milliseconds
    /// after its first byte, then goes on. The engine does not wait (as vLLM's does not for its
    /// HTTP writer): the request counts as finished in `/metrics` while its client still waits,
    /// as behind a stalled connection or a paused process.
    #[arg(long, default_value_t = 0)]
    pub stall_after_first_byte_ms: u64,
    /// Fault: this fraction of completion requests (0 to 1, spread evenly: request n fails when
    /// floor(n * rate) moves) is answered 500 at once with vLLM's error body, as by an engine
    /// error; `/metrics` and `/health` still answer.
    #[arg(long, default_value_t = 0.0)]
    pub error_rate: f64,
    /// Answer every request with the request headers it arrived with, as a JSON array of
    /// `[name, value]` pairs in `x-sim-request-headers` ([`crate::api::REQUEST_HEADERS_HEADER`]):
    /// tests through a proxy see what reached the pod, not what the proxy's own header map held.
    #[arg(long)]
    pub echo_request_headers: bool,

    /// Serve `GET`/`POST /debug/state`: the engine's queue, a prompt's longest cached prefix
    /// and its predicted time to first token (`crate::engine::Probe`). For the bench's oracle
    /// router only: no vLLM has it, warmroute never reads it, and no shipped config sets it.
    #[arg(long)]
    pub debug_state: bool,

    /// Keep `/v1/responses` answers for follow-ups by `previous_response_id`, in this
    /// process's memory (vLLM's `VLLM_ENABLE_RESPONSES_API_STORE=1`, which also turns it on).
    #[arg(long)]
    pub enable_responses_store: bool,
}

/// One `--lora-modules` entry (vLLM's `LoRAModulePath`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoraModule {
    pub name: String,
    pub path: String,
    pub base_model_name: Option<String>,
}

/// Parses a `--lora-modules` value as vLLM's `LoRAParserAction` does: `name=path` when the value
/// has a `=` and no `,`, JSON otherwise.
pub fn parse_lora_module(s: &str) -> Result<LoraModule, String> {
    let module = if s.contains('=') && !s.contains(',') {
        let mut parts = s.split('=');
        match (parts.next(), parts.next(), parts.next()) {
            (Some(name), Some(path), None) => LoraModule {
                name: name.to_string(),
                path: path.to_string(),
                base_model_name: None,
            },
            _ => return Err(format!("expected name=path, got {s:?}")),
        }
    } else {
        let Ok(Value::Object(obj)) = serde_json::from_str::<Value>(s) else {
            return Err(format!("Invalid JSON format for --lora-modules: {s}"));
        };
        if let Some(key) = obj
            .keys()
            .find(|k| !["name", "path", "base_model_name"].contains(&k.as_str()))
        {
            return Err(format!(
                "Invalid fields for --lora-modules: {s} - unexpected {key:?}"
            ));
        }
        let text = |key: &str| match obj.get(key) {
            Some(Value::String(v)) => Ok(Some(v.clone())),
            None | Some(Value::Null) => Ok(None),
            Some(_) => Err(format!(
                "Invalid fields for --lora-modules: {s} - {key:?} must be a string"
            )),
        };
        LoraModule {
            name: text("name")?.unwrap_or_default(),
            path: text("path")?.unwrap_or_default(),
            base_model_name: text("base_model_name")?,
        }
    };
    // vLLM loads each module through its load endpoint's check at startup.
    if module.name.is_empty() || module.path.is_empty() {
        return Err("Both 'lora_name' and 'lora_path' must be provided.".into());
    }
    Ok(module)
}

impl Default for Args {
    fn default() -> Self {
        Self::parse_from(["warmroute-sim"])
    }
}

impl Args {
    /// The replica name: `--name`, or `sim-<port>`.
    pub fn replica_name(&self, bound_port: u16) -> String {
        self.name
            .clone()
            .unwrap_or_else(|| format!("sim-{bound_port}"))
    }

    /// Rejects flag combinations vLLM refuses at startup.
    pub fn validate(&self) -> Result<(), String> {
        if !self.enable_lora && !self.lora_modules.is_empty() {
            // vLLM fails loading the static adapters with the worker's error.
            return Err("LoRA is not enabled. Use --enable-lora to enable LoRA.".into());
        }
        for (i, m) in self.lora_modules.iter().enumerate() {
            if self.lora_modules[..i].iter().any(|o| o.name == m.name) {
                return Err(format!(
                    "The lora adapter '{}' has already been loaded.",
                    m.name
                ));
            }
        }
        Ok(())
    }

    /// The names the base model answers to: `--served-model-name`, or `--model`.
    /// Whether `/v1/responses` stores answers: `--enable-responses-store`, or vLLM's
    /// environment variable `VLLM_ENABLE_RESPONSES_API_STORE=1`.
    pub fn responses_store_enabled(&self) -> bool {
        self.enable_responses_store
            || std::env::var("VLLM_ENABLE_RESPONSES_API_STORE").is_ok_and(|v| v == "1")
    }

    pub fn served_model_names(&self) -> Vec<String> {
        if self.served_model_name.is_empty() {
            vec![self.model.clone()]
        } else {
            self.served_model_name.clone()
        }
    }

    /// Engine part of the configuration (sanitised: no zero block size / capacity, positive time
    /// scale).
    pub fn engine_config(&self) -> EngineConfig {
        let block_size = self.block_size.max(1);
        EngineConfig {
            block_size,
            num_blocks: (self.kv_capacity_tokens / block_size).max(1),
            max_num_seqs: self.max_num_seqs.max(1),
            max_num_batched_tokens: self.max_num_batched_tokens.max(1),
            max_model_len: self.max_model_len.max(1),
            base_ms: self.base_ms.max(0.0),
            prefill_ms_per_token: self.prefill_ms_per_token.max(0.0),
            decode_ms_per_seq: self.decode_ms_per_seq.max(0.0),
            time_scale: if self.time_scale.is_finite() && self.time_scale > 0.0 {
                self.time_scale
            } else {
                1.0
            },
            max_loras: self
                .enable_lora
                .then(|| usize::try_from(self.max_loras).unwrap_or(usize::MAX).max(1)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Args, clap::Error> {
        Args::try_parse_from([&["warmroute-sim"], args].concat())
    }

    #[test]
    fn lora_modules_take_both_vllm_forms() {
        let a = parse(&[
            "--enable-lora",
            "--lora-modules",
            "sql=/adapters/sql",
            r#"{"name": "chat", "path": "/adapters/chat", "base_model_name": "m2"}"#,
            "--served-model-name",
            "m1",
            "m2",
        ])
        .unwrap();
        assert_eq!(
            a.lora_modules,
            vec![
                LoraModule {
                    name: "sql".into(),
                    path: "/adapters/sql".into(),
                    base_model_name: None
                },
                LoraModule {
                    name: "chat".into(),
                    path: "/adapters/chat".into(),
                    base_model_name: Some("m2".into())
                },
            ]
        );
        assert_eq!(a.served_model_names(), ["m1", "m2"]);
        assert_eq!(a.engine_config().max_loras, Some(1));
        assert!(a.validate().is_ok());
        for bad in [
            "a=b=c",
            "{\"name\": \"x\"}",
            "{\"name\": \"x\", \"path\": \"p\", \"rank\": 8}",
            "not json",
            "=path",
        ] {
            assert!(
                parse(&["--enable-lora", "--lora-modules", bad]).is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn lora_flags_are_checked_like_vllm() {
        assert_eq!(parse(&[]).unwrap().engine_config().max_loras, None);
        assert!(parse(&["--max-loras", "0"]).is_err());
        let a = parse(&["--enable-lora", "--max-loras", "4"]).unwrap();
        assert_eq!(a.engine_config().max_loras, Some(4));
        let no_enable = parse(&["--lora-modules", "a=/a"]).unwrap();
        assert!(no_enable
            .validate()
            .is_err_and(|e| e.contains("--enable-lora")));
        let twice = parse(&["--enable-lora", "--lora-modules", "a=/a", "a=/b"]).unwrap();
        assert!(twice
            .validate()
            .is_err_and(|e| e.contains("already been loaded")));
    }
}
