//! Command-line flags of `warmroute-sim` (clap derive), shared with the loadgen/bench so they can
//! embed a simulated replica with the same knobs.
//!
//! Defaults resemble Llama-3.1-8B in bf16 on one H100 80 GB under vLLM:
//! * prefill ~0.06 ms per uncached prompt token (~16k tok/s of prefill);
//! * a decode step costs 12 ms plus 0.15 ms per running sequence (weights read once per step,
//!   plus per-sequence attention/KV reads);
//! * ~400k tokens of KV cache (25000 blocks of 16 tokens);
//! * vLLM's scheduler limits: 8192 batched tokens per step, 256 running sequences.

use clap::Parser;

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

    /// The names the base model answers to: `--served-model-name`, or `--model`.
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
            max_loras: None,
        }
    }
}
