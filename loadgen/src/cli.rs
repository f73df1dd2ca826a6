//! Command line: `warmroute-loadgen <workload> [flags]`.
//!
//! Flow: parse flags → generate the workload (all bodies rendered) → scrape
//! backends' `/metrics` → run → scrape again → print the summary, write JSON.
//! Defaults are small: against a 3-replica sim fleet with `--time-scale 10`
//! each workload finishes in roughly 10–20 s.
//!
//! Exit codes: 0 success; 1 bad input or setup failure; 2 `--fail-on-error`
//! and at least one request failed (or none succeeded).

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};

use crate::oracle;
use crate::prom::{metrics_url, BackendDelta, CacheCounters};
use crate::report::{process_cpu_seconds, Report};
use crate::runner::{build_client, get_text, run_with_client, HttpClient, RunConfig, POOL_IDLE};
use crate::workload::{self, Api, RenderOpts, Workload};

/// Load client for warmroute: deterministic LLM workloads against an OpenAI-compatible endpoint.
#[derive(Debug, Parser)]
#[command(name = "warmroute-loadgen", version, about)]
pub struct Cli {
    /// Workload to run.
    #[command(subcommand)]
    pub workload: WorkloadCmd,
}

/// Workloads.
#[derive(Debug, Subcommand)]
pub enum WorkloadCmd {
    /// Replay the Mooncake conversation trace (shared prefixes from hash_ids).
    Conversation {
        #[command(flatten)]
        common: Common,
        #[command(flatten)]
        args: ConversationArgs,
    },
    /// Concurrent tool-using agents, each sending its growing context every step.
    Agent {
        #[command(flatten)]
        common: Common,
        #[command(flatten)]
        args: AgentArgs,
    },
    /// Multi-turn chat sessions with think time and `x-session-id`.
    Chat {
        #[command(flatten)]
        common: Common,
        #[command(flatten)]
        args: ChatArgs,
    },
    /// Independent random prompts (no shared prefix), Poisson arrivals.
    Uniform {
        #[command(flatten)]
        common: Common,
        #[command(flatten)]
        args: UniformArgs,
    },
    /// Interactive chats (Poisson) alongside closed-loop long batch jobs, each tagged
    /// `x-warmroute-priority`; the report breaks results down per class.
    Mixed {
        #[command(flatten)]
        common: Common,
        #[command(flatten)]
        args: MixedArgs,
    },
}

/// Flags shared by all workloads.
#[derive(Debug, Args)]
pub struct Common {
    /// Base URL requests go to (the Envoy listener). Repeat to spread requests over
    /// several gateways in front of the same fleet: round robin on the send order,
    /// per request (a session's steps move between gateways).
    #[arg(
        long = "target",
        default_value = "http://127.0.0.1:10000",
        num_args = 1
    )]
    pub targets: Vec<String>,
    /// Backend base URL whose /metrics is scraped before and after (repeatable).
    #[arg(long = "backend")]
    pub backends: Vec<String>,
    /// Seed for the workload generator.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// `model` sent in every request.
    #[arg(long, default_value = "sim-llama-8b")]
    pub model: String,
    /// Send vLLM's `ignore_eos: true` (real servers then generate exactly max_tokens).
    #[arg(long)]
    pub ignore_eos: bool,
    /// Hard bound on the run in seconds (in-flight requests are cut and counted as aborted).
    #[arg(long, default_value_t = 120.0)]
    pub max_seconds: f64,
    /// Send at most this many requests.
    #[arg(long)]
    pub max_requests: Option<usize>,
    /// Max requests in flight (0 = unbounded).
    #[arg(long, default_value_t = 0)]
    pub concurrency: usize,
    /// Per-request timeout in seconds.
    #[arg(long, default_value_t = 60.0)]
    pub timeout_s: f64,
    /// Seconds an idle keep-alive connection stays pooled. Keep it below the server's drain
    /// time when the server reloads mid-run (Envoy closes a drained listener's idle
    /// connections when the drain ends).
    #[arg(long, default_value_t = POOL_IDLE.as_secs_f64())]
    pub pool_idle_s: f64,
    /// Write the JSON report here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Write one JSON line per request here.
    #[arg(long)]
    pub records: Option<PathBuf>,
    /// Client runtime worker threads (1 = single-threaded runtime, the cheapest).
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// Generate the workload and print its size, send nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Exit with status 2 if any request failed or none succeeded.
    #[arg(long)]
    pub fail_on_error: bool,
    /// Do not print the human summary.
    #[arg(long)]
    pub quiet: bool,
    /// A simulated pod the oracle probes before each request (repeatable; the sims must run
    /// with `--debug-state`). Bench only: see the `oracle` module. Without `--oracle` the
    /// requests still go to `--target` and each record carries the oracle's pick (shadow mode).
    #[arg(long = "oracle-pod")]
    pub oracle_pods: Vec<String>,
    /// Send each request to the oracle's pick among `--oracle-pod`s directly (`--target` unused).
    #[arg(long, requires = "oracle_pods")]
    pub oracle: bool,
}

/// `conversation` flags.
#[derive(Debug, Args)]
pub struct ConversationArgs {
    /// Mooncake trace (JSONL).
    #[arg(long, default_value = "../shared/traces/conversation_trace.jsonl")]
    pub trace: PathBuf,
    /// Divide trace timestamps by this.
    #[arg(long, default_value_t = 6.0)]
    pub speedup: f64,
    /// Multiply token counts by this (0.125: 512-token blocks become 64 words).
    #[arg(long, default_value_t = 0.125)]
    pub length_scale: f64,
    /// Multiply output lengths by this (default: --length-scale).
    #[arg(long)]
    pub output_scale: Option<f64>,
    /// Cap max_tokens after scaling (0 = none).
    #[arg(long, default_value_t = 0)]
    pub max_output: u32,
    /// Replay at most this many trace lines.
    #[arg(long, default_value_t = 200)]
    pub limit: usize,
    /// Start at this many seconds of trace time (earlier lines skipped, later shifted).
    #[arg(long, default_value_t = 0.0)]
    pub start_offset: f64,
    /// Endpoint: completions (prompt string) or chat (one user message).
    #[arg(long, value_enum, default_value_t = Api::Completions)]
    pub api: Api,
}

/// `agent` flags.
#[derive(Debug, Args)]
pub struct AgentArgs {
    /// Concurrent agents.
    #[arg(long, default_value_t = 16)]
    pub agents: usize,
    /// Sequential steps per agent.
    #[arg(long, default_value_t = 10)]
    pub steps: usize,
    /// Shared system prompt length (tokens).
    #[arg(long, default_value_t = 2048)]
    pub system_tokens: usize,
    /// Per-agent task message length (tokens).
    #[arg(long, default_value_t = 128)]
    pub task_tokens: usize,
    /// Assistant message length per step (tokens); also max_tokens.
    #[arg(long, default_value_t = 48)]
    pub output_tokens: usize,
    /// Median tool output length (tokens, log-normal).
    #[arg(long, default_value_t = 300.0)]
    pub tool_median: f64,
    /// Log-normal sigma of tool output lengths (skew).
    #[arg(long, default_value_t = 1.0)]
    pub tool_sigma: f64,
    /// Cap on one tool output (tokens).
    #[arg(long, default_value_t = 4000)]
    pub tool_max: usize,
    /// Mean tool run time between steps (ms, exponential).
    #[arg(long, default_value_t = 400.0)]
    pub tool_ms: f64,
    /// Agent i starts at i * stagger (ms).
    #[arg(long, default_value_t = 200.0)]
    pub stagger_ms: f64,
}

/// `chat` flags.
#[derive(Debug, Args)]
pub struct ChatArgs {
    /// Number of chat sessions.
    #[arg(long, default_value_t = 24)]
    pub sessions: usize,
    /// Turns per session.
    #[arg(long, default_value_t = 4)]
    pub turns: usize,
    /// Session arrival rate (sessions/s, Poisson).
    #[arg(long, default_value_t = 4.0)]
    pub rate: f64,
    /// Mean think time between turns (ms, exponential).
    #[arg(long, default_value_t = 1000.0)]
    pub think_ms: f64,
    /// Shared system prompt length (tokens).
    #[arg(long, default_value_t = 256)]
    pub system_tokens: usize,
    /// Median user message length (tokens, log-normal).
    #[arg(long, default_value_t = 60.0)]
    pub user_tokens: f64,
    /// Assistant reply length (tokens); also max_tokens.
    #[arg(long, default_value_t = 48)]
    pub output_tokens: usize,
}

/// `uniform` flags.
#[derive(Debug, Args)]
pub struct UniformArgs {
    /// Number of requests.
    #[arg(long, default_value_t = 200)]
    pub requests: usize,
    /// Arrival rate (requests/s, Poisson).
    #[arg(long, default_value_t = 20.0)]
    pub rate: f64,
    /// Prompt length (tokens).
    #[arg(long, default_value_t = 512)]
    pub prompt_tokens: usize,
    /// max_tokens.
    #[arg(long, default_value_t = 32)]
    pub output_tokens: u32,
    /// Endpoint.
    #[arg(long, value_enum, default_value_t = Api::Completions)]
    pub api: Api,
}

/// `mixed` flags.
#[derive(Debug, Args)]
pub struct MixedArgs {
    /// Interactive requests.
    #[arg(long, default_value_t = 100)]
    pub interactive: usize,
    /// Interactive arrival rate (requests/s, Poisson).
    #[arg(long, default_value_t = 10.0)]
    pub rate: f64,
    /// When the first interactive request arrives (ms after the start; batch starts at 0).
    #[arg(long, default_value_t = 500.0)]
    pub interactive_start_ms: f64,
    /// Interactive shared system prompt (tokens).
    #[arg(long, default_value_t = 256)]
    pub system_tokens: usize,
    /// Median interactive user message (tokens, log-normal).
    #[arg(long, default_value_t = 60.0)]
    pub user_tokens: f64,
    /// Interactive max_tokens.
    #[arg(long, default_value_t = 48)]
    pub output_tokens: u32,
    /// Closed-loop batch workers.
    #[arg(long, default_value_t = 8)]
    pub batch_workers: usize,
    /// Jobs per batch worker, sent back to back.
    #[arg(long, default_value_t = 4)]
    pub batch_jobs: usize,
    /// Batch prompt length (tokens).
    #[arg(long, default_value_t = 1024)]
    pub batch_prompt_tokens: usize,
    /// Batch max_tokens (the median with --batch-output-sigma).
    #[arg(long, default_value_t = 128)]
    pub batch_output_tokens: u32,
    /// Log-normal sigma of batch max_tokens (0: all the same).
    #[arg(long, default_value_t = 0.0)]
    pub batch_output_sigma: f64,
}

impl WorkloadCmd {
    /// Common flags.
    pub fn common(&self) -> &Common {
        match self {
            WorkloadCmd::Conversation { common, .. }
            | WorkloadCmd::Agent { common, .. }
            | WorkloadCmd::Chat { common, .. }
            | WorkloadCmd::Uniform { common, .. }
            | WorkloadCmd::Mixed { common, .. } => common,
        }
    }

    /// Generate the workload (all bodies rendered).
    pub fn generate(&self) -> Result<Workload> {
        let c = self.common();
        let ro = RenderOpts {
            model: c.model.clone(),
            ignore_eos: c.ignore_eos,
        };
        match self {
            WorkloadCmd::Conversation { args: a, .. } => workload::conversation(
                &resolve_trace(&a.trace),
                &workload::ConversationOpts {
                    speedup: a.speedup,
                    length_scale: a.length_scale,
                    output_scale: a.output_scale,
                    limit: a.limit,
                    start_offset_s: a.start_offset,
                    api: a.api,
                    max_output: a.max_output,
                },
                &ro,
            ),
            WorkloadCmd::Agent { args: a, .. } => workload::agent(
                &workload::AgentOpts {
                    agents: a.agents,
                    steps: a.steps,
                    system_tokens: a.system_tokens,
                    task_tokens: a.task_tokens,
                    assistant_tokens: a.output_tokens,
                    tool_median: a.tool_median,
                    tool_sigma: a.tool_sigma,
                    tool_max: a.tool_max,
                    tool_ms: a.tool_ms,
                    stagger_ms: a.stagger_ms,
                    seed: c.seed,
                },
                &ro,
            ),
            WorkloadCmd::Chat { args: a, .. } => workload::chat(
                &workload::ChatOpts {
                    sessions: a.sessions,
                    turns: a.turns,
                    rate: a.rate,
                    think_ms: a.think_ms,
                    system_tokens: a.system_tokens,
                    user_median: a.user_tokens,
                    reply_tokens: a.output_tokens,
                    seed: c.seed,
                },
                &ro,
            ),
            WorkloadCmd::Uniform { args: a, .. } => workload::uniform(
                &workload::UniformOpts {
                    requests: a.requests,
                    rate: a.rate,
                    prompt_tokens: a.prompt_tokens,
                    output_tokens: a.output_tokens,
                    api: a.api,
                    seed: c.seed,
                },
                &ro,
            ),
            WorkloadCmd::Mixed { args: a, .. } => workload::mixed(
                &workload::MixedOpts {
                    interactive: a.interactive,
                    rate: a.rate,
                    interactive_start_ms: a.interactive_start_ms,
                    system_tokens: a.system_tokens,
                    user_median: a.user_tokens,
                    output_tokens: a.output_tokens,
                    batch_workers: a.batch_workers,
                    batch_jobs: a.batch_jobs,
                    batch_prompt_tokens: a.batch_prompt_tokens,
                    batch_output_tokens: a.batch_output_tokens,
                    batch_output_sigma: a.batch_output_sigma,
                    seed: c.seed,
                },
                &ro,
            ),
        }
    }
}

/// The trace path as given; if it does not exist and is relative, also try it
/// relative to this crate's directory's parent (the repo root), so the default
/// works from `loadgen/` and from the repo root alike.
fn resolve_trace(path: &std::path::Path) -> PathBuf {
    if path.exists() || path.is_absolute() {
        return path.to_path_buf();
    }
    let from_root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(path);
    if from_root.exists() {
        from_root
    } else {
        path.to_path_buf()
    }
}

const SCRAPE_TIMEOUT: Duration = Duration::from_secs(5);

async fn scrape_all(
    client: &HttpClient,
    backends: &[String],
) -> Vec<Result<CacheCounters, String>> {
    let futs = backends.iter().map(|b| async move {
        let text = get_text(client, &metrics_url(b), SCRAPE_TIMEOUT).await?;
        CacheCounters::from_text(&text)
            .ok_or_else(|| "no vllm:prefix_cache_{hits,queries}_total".to_string())
    });
    let mut out = Vec::with_capacity(backends.len());
    for f in futs {
        out.push(f.await);
    }
    out
}

/// Run one workload end to end; returns the report.
pub async fn execute(cmd: &WorkloadCmd, workload: Workload) -> Result<Report> {
    let c = cmd.common();
    let mut cfg = RunConfig {
        target: c.targets.first().cloned().unwrap_or_default(),
        extra_targets: c.targets.iter().skip(1).cloned().collect(),
        max_seconds: c.max_seconds,
        max_requests: c.max_requests,
        concurrency: c.concurrency,
        timeout: Duration::from_secs_f64(c.timeout_s.max(0.001)),
        oracle: None,
    };
    let client = build_client(
        Duration::from_secs(5),
        Duration::from_secs_f64(c.pool_idle_s.max(0.001)),
    );
    if !c.oracle_pods.is_empty() {
        // Before the run's clock: the probes are the requests as the pods will see them.
        let block_size = oracle::block_size(&client, &c.oracle_pods).await?;
        cfg.oracle = Some(oracle::Oracle {
            pods: c.oracle_pods.clone(),
            route: c.oracle,
            probes: oracle::probes(&workload, block_size)?,
        });
    }
    let before = scrape_all(&client, &c.backends).await;
    let name = workload.name;
    let agent_steps = workload.agent_steps;
    let cpu0 = process_cpu_seconds();
    let run = run_with_client(workload, &cfg, client.clone()).await?;
    let cpu = process_cpu_seconds() - cpu0;
    let after = scrape_all(&client, &c.backends).await;
    let deltas = c
        .backends
        .iter()
        .zip(before.into_iter().zip(after))
        .map(|(url, (b, a))| BackendDelta::compute(url, b, a))
        .collect();
    if let Some(path) = &c.records {
        let mut f = std::io::BufWriter::new(
            std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?,
        );
        for r in &run.records {
            serde_json::to_writer(&mut f, r)?;
            f.write_all(b"\n")?;
        }
        f.flush()?;
    }
    Ok(Report::build(
        name,
        &c.targets.join(","),
        agent_steps,
        &run,
        deltas,
        cpu,
    ))
}

/// Parse-free entry point: returns the process exit code.
pub fn main_with(cli: Cli) -> Result<i32> {
    let cmd = &cli.workload;
    let c = cmd.common();
    let workload = cmd.generate()?;
    if c.dry_run {
        let bytes: usize = workload
            .sessions
            .iter()
            .flat_map(|s| &s.requests)
            .map(|r| r.body.len())
            .sum();
        let words: usize = workload
            .sessions
            .iter()
            .flat_map(|s| &s.requests)
            .map(|r| r.prompt_words)
            .sum();
        let last = workload
            .sessions
            .iter()
            .map(|s| s.start)
            .max()
            .unwrap_or_default();
        println!(
            "{}: {} sessions, {} requests, {} prompt words, {} body bytes, last session starts at {:.1}s",
            workload.name,
            workload.sessions.len(),
            workload.total_requests(),
            words,
            bytes,
            last.as_secs_f64()
        );
        return Ok(0);
    }
    let rt = if c.threads <= 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(c.threads)
            .enable_all()
            .build()?
    };
    let report = rt.block_on(execute(cmd, workload))?;
    if !c.quiet {
        print!("{}", report.human());
    }
    if let Some(path) = &c.json {
        let text = serde_json::to_string_pretty(&report)?;
        std::fs::write(path, text + "\n").with_context(|| format!("writing {}", path.display()))?;
    }
    if c.fail_on_error && (report.errors > 0 || report.ok == 0) {
        return Ok(2);
    }
    Ok(0)
}
