//! `warmroute-sim`: a simulated vLLM server, the default fleet for warmroute's demo, tests and
//! benchmarks.
//!
//! It behaves like vLLM wherever a router can observe it:
//! * [`cache`]: a block prefix cache with chained block hashes, pinning and LRU eviction, so
//!   `usage.prompt_tokens_details.cached_tokens` and the prefix-cache counters move like vLLM's;
//! * [`engine`]: continuous batching as a step loop (chunked prefill, `max_num_seqs`, FIFO
//!   waiting queue, KV-capacity admission, vLLM's `max_loras` limit on LoRA adapters per batch)
//!   with a linear cost model, so latency depends on load and on cache hits the way it does on a
//!   GPU;
//! * [`api`]: the OpenAI-compatible HTTP API (JSON and SSE) with vLLM's error shapes, several
//!   served model names and LoRA adapters (static and loaded at run time);
//! * [`metrics`]: `/metrics` with vLLM's metric names, `vllm:lora_requests_info` included.
//!
//! `main.rs` only parses [`config::Args`] and calls [`serve`]; the loadgen/bench can embed
//! replicas the same way, or drive an [`engine::Engine`] step by step without a clock.
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

pub mod api;
pub mod cache;
pub mod config;
pub mod engine;
pub mod metrics;

use std::future::Future;
use std::io;

use axum::serve::ListenerExt;
use tokio::net::TcpListener;

pub use api::{REPLICA_HEADER, REQUEST_HEADERS_HEADER};
pub use config::Args;

/// Binds `--host:--port` (port 0 picks a free one).
pub async fn bind(args: &Args) -> io::Result<TcpListener> {
    TcpListener::bind((args.host.as_str(), args.port)).await
}

/// Serves the simulator on `listener` until `shutdown` resolves. The replica name defaults to
/// `sim-<bound port>`.
pub async fn serve_with_shutdown(
    args: Args,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    args.validate()
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    let port = listener.local_addr()?.port();
    let state = api::AppState::new(&args, port);
    // TCP_NODELAY on every accepted connection, as vLLM's server has it (asyncio sets it on
    // every TCP transport): with Nagle on, a token written while the previous write is still
    // unacknowledged waits for the client's delayed ACK, up to 40 ms on Linux, which showed as
    // a first token 40 ms late on a warm keep-alive connection.
    let listener = listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    axum::serve(listener, api::router(state))
        .with_graceful_shutdown(shutdown)
        .await
}

/// Serves the simulator on `listener` forever.
pub async fn serve(args: Args, listener: TcpListener) -> io::Result<()> {
    serve_with_shutdown(args, listener, std::future::pending()).await
}
