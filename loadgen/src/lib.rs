//! warmroute-loadgen: deterministic workloads and a cheap, measuring load client
//! for warmroute demos, end-to-end tests and benchmarks.
//!
//! - [`workload`]: session/request generators (trace replay, agents, chat, uniform,
//!   mixed priority classes).
//! - [`runner`]: drives sessions over a keep-alive HTTP/1.1 pool (TCP_NODELAY),
//!   records TTFT (first SSE `data:` chunk), e2e, served-by replica and usage.
//! - [`prom`]: backends' prefix-cache counters (via `warmroute_core::fleet::prometheus`)
//!   and the fleet hit rate.
//! - [`report`]: statistics, human summary and the JSON report.
//! - [`oracle`]: the bench's oracle router, which reads each simulated pod's actual cache
//!   and queue (`warmroute-sim --debug-state`) and picks the pod with the least predicted TTFT.
//! - [`cli`]: the `warmroute-loadgen <workload> [flags]` command line.
//!
//! Non-test code never unwraps: inputs (trace files, server responses, metrics
//! pages) come from outside and failures must become reported errors, not
//! panics that would lose a whole benchmark run.

pub mod cli;
pub mod oracle;
pub mod prom;
pub mod report;
pub mod rng;
pub mod runner;
pub mod workload;
