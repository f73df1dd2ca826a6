//! Statistics, the JSON report and the human summary.
//!
//! Percentiles use linear interpolation between closest ranks (the "R-7"
//! definition used by NumPy's default and Excel's `PERCENTILE.INC`):
//! `p(q) = x[floor(h)] + (h − floor(h)) (x[floor(h)+1] − x[floor(h)])` with
//! `h = (n − 1) q / 100` over the sorted samples. With few samples this is
//! smoother than nearest-rank, and p0/p100 are the min/max.
//!
//! Latency statistics cover successful requests only; errors and deadline
//! aborts are counted separately so a failing run cannot look fast.
//! A 429 (shed by the gateway) is counted apart from errors: it is an answer,
//! not a loss.
//!
//! **Per class** (requests carrying a priority class, e.g. the `mixed`
//! workload): sent, answered, shed, failed, aborted and never-sent counts,
//! `lost = failed + aborted + never sent`, TTFT and e2e of the answered, and
//! `output_tokens_per_s = Σ usage.completion_tokens of the answered /
//! (last answer's end − first answered request's start)`: the class's
//! completed-token rate over the span it was served in.
//!
//! `client_cpu_s` is user+system CPU time of this process during the run
//! (`getrusage(RUSAGE_SELF)`), to show the client core was not the bottleneck.

use std::collections::BTreeMap;
use std::fmt::Write;

use serde::Serialize;

use crate::prom::{fleet_hit_rate, BackendDelta};
use crate::runner::{Outcome, RequestRecord, RunResult};

/// Summary statistics of a sample (ms).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Stats {
    /// Sample count.
    pub n: usize,
    /// Arithmetic mean.
    pub mean: f64,
    /// Median.
    pub p50: f64,
    /// 95th percentile.
    pub p95: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Maximum.
    pub max: f64,
}

/// Percentile `q` in `[0, 100]` of an ascending slice (R-7 interpolation).
pub fn percentile(sorted: &[f64], q: f64) -> Option<f64> {
    let n = sorted.len();
    if n == 0 {
        return None;
    }
    let h = (n - 1) as f64 * (q.clamp(0.0, 100.0) / 100.0);
    let lo = h.floor() as usize;
    let hi = (lo + 1).min(n - 1);
    Some(sorted[lo] + (h - lo as f64) * (sorted[hi] - sorted[lo]))
}

impl Stats {
    /// Statistics of `values`; `None` when empty. NaNs are dropped.
    pub fn of(values: impl IntoIterator<Item = f64>) -> Option<Stats> {
        let mut v: Vec<f64> = values.into_iter().filter(|x| !x.is_nan()).collect();
        if v.is_empty() {
            return None;
        }
        v.sort_by(f64::total_cmp);
        let mean = v.iter().sum::<f64>() / v.len() as f64;
        Some(Stats {
            n: v.len(),
            mean,
            p50: percentile(&v, 50.0)?,
            p95: percentile(&v, 95.0)?,
            p99: percentile(&v, 99.0)?,
            max: *v.last()?,
        })
    }
}

/// User + system CPU seconds consumed by this process so far.
pub fn process_cpu_seconds() -> f64 {
    // SAFETY: getrusage only writes into the zero-initialised struct we own.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointer to a rusage; RUSAGE_SELF is always supported.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) } != 0 {
        return 0.0;
    }
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// The JSON report (`--json FILE`).
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// Workload name.
    pub workload: String,
    /// Target URL.
    pub target: String,
    /// Requests sent (ok + errors + aborted).
    pub requests: usize,
    /// Successful requests.
    pub ok: usize,
    /// Failed requests.
    pub errors: usize,
    /// Requests refused with a 429 (shed by the gateway).
    pub shed: usize,
    /// Requests cut by `--max-seconds`.
    pub aborted: usize,
    /// Requests never sent (deadline / `--max-requests`).
    pub skipped: usize,
    /// Wall time of the run.
    pub runtime_s: f64,
    /// Unix time the run started, ms: records' `start_ms` count from it.
    pub started_unix_ms: f64,
    /// Successful requests per second.
    pub throughput_rps: f64,
    /// Fleet prefix-cache hit rate from backend metrics: ΣΔhits / ΣΔqueries.
    pub hit_rate: Option<f64>,
    /// Σcached_tokens / Σprompt_tokens from response usage (client view).
    pub usage_hit_rate: Option<f64>,
    /// Σ usage.prompt_tokens of successful requests.
    pub prompt_tokens: u64,
    /// Σ usage.prompt_tokens_details.cached_tokens of successful requests.
    pub cached_tokens: u64,
    /// Time to first token (ms).
    pub ttft_ms: Option<Stats>,
    /// End-to-end latency (ms).
    pub e2e_ms: Option<Stats>,
    /// Agent step latency (ms; e2e of each agent step), agent workload only.
    pub step_ms: Option<Stats>,
    /// Fraction of responses served by each replica (`x-sim-replica`; `unknown` if absent).
    pub share: BTreeMap<String, f64>,
    /// Responses per replica.
    pub served: BTreeMap<String, usize>,
    /// Requests sent to each target (gateway), in `--target` order.
    pub per_target: Vec<usize>,
    /// Per-backend metric deltas.
    pub backends: Vec<BackendDelta>,
    /// Client CPU seconds used during the run.
    pub client_cpu_s: f64,
    /// `client_cpu_s / runtime_s` (1.0 = one core saturated).
    pub client_cpu_util: f64,
    /// Up to 5 distinct error messages with counts.
    pub error_samples: BTreeMap<String, usize>,
    /// Results per priority class (empty when no request has one).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub classes: BTreeMap<String, ClassReport>,
}

/// The results of one priority class.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ClassReport {
    /// Requests sent.
    pub requests: usize,
    /// Answered (2xx, complete stream).
    pub ok: usize,
    /// Refused with a 429.
    pub shed: usize,
    /// Failed (transport error, other non-2xx, timeout, truncated stream).
    pub errors: usize,
    /// Cut by `--max-seconds`.
    pub aborted: usize,
    /// Never sent (deadline / `--max-requests`).
    pub skipped: usize,
    /// `errors + aborted + skipped`: neither answered nor shed.
    pub lost: usize,
    /// Time to first token of the answered (ms).
    pub ttft_ms: Option<Stats>,
    /// End-to-end latency of the answered (ms).
    pub e2e_ms: Option<Stats>,
    /// Σ `usage.completion_tokens` of the answered.
    pub output_tokens: u64,
    /// From the first answered request's start to the last one's end (s).
    pub span_s: f64,
    /// `output_tokens / span_s` (0 when nothing was answered).
    pub output_tokens_per_s: f64,
}

impl ClassReport {
    /// The class's figures from its records and its never-sent count.
    pub fn of(recs: &[&RequestRecord], skipped: usize) -> ClassReport {
        let count = |o: Outcome| recs.iter().filter(|r| r.outcome == o).count();
        let ok: Vec<_> = recs.iter().filter(|r| r.outcome == Outcome::Ok).collect();
        let (errors, aborted) = (count(Outcome::Error), count(Outcome::Aborted));
        let output_tokens = ok.iter().filter_map(|r| r.completion_tokens).sum();
        let first = ok.iter().map(|r| r.start_ms).min_by(f64::total_cmp);
        let last = ok
            .iter()
            .map(|r| r.start_ms + r.e2e_ms)
            .max_by(f64::total_cmp);
        let span_s = match (first, last) {
            (Some(a), Some(b)) => ((b - a) / 1000.0).max(0.0),
            _ => 0.0,
        };
        ClassReport {
            requests: recs.len(),
            ok: ok.len(),
            shed: count(Outcome::Shed),
            errors,
            aborted,
            skipped,
            lost: errors + aborted + skipped,
            ttft_ms: Stats::of(ok.iter().filter_map(|r| r.ttft_ms)),
            e2e_ms: Stats::of(ok.iter().map(|r| r.e2e_ms)),
            output_tokens,
            span_s,
            output_tokens_per_s: if span_s > 0.0 {
                output_tokens as f64 / span_s
            } else {
                0.0
            },
        }
    }
}

impl Report {
    /// Build a report from a run and the backends' metric deltas.
    pub fn build(
        workload: &str,
        target: &str,
        agent_steps: bool,
        run: &RunResult,
        backends: Vec<BackendDelta>,
        client_cpu_s: f64,
    ) -> Report {
        let recs = &run.records;
        let ok: Vec<_> = recs.iter().filter(|r| r.outcome == Outcome::Ok).collect();
        let errors = recs.iter().filter(|r| r.outcome == Outcome::Error).count();
        let shed = recs.iter().filter(|r| r.outcome == Outcome::Shed).count();
        let mut names: Vec<&String> = recs.iter().filter_map(|r| r.class.as_ref()).collect();
        names.extend(run.skipped_by_class.keys());
        names.sort();
        names.dedup();
        let classes = names
            .into_iter()
            .map(|c| {
                let of: Vec<_> = recs
                    .iter()
                    .filter(|r| r.class.as_ref() == Some(c))
                    .collect();
                let skipped = run.skipped_by_class.get(c).copied().unwrap_or(0);
                (c.clone(), ClassReport::of(&of, skipped))
            })
            .collect();
        let aborted = recs
            .iter()
            .filter(|r| r.outcome == Outcome::Aborted)
            .count();
        let mut served: BTreeMap<String, usize> = BTreeMap::new();
        for r in recs.iter().filter(|r| r.status.is_some()) {
            *served
                .entry(r.replica.clone().unwrap_or_else(|| "unknown".into()))
                .or_default() += 1;
        }
        let total_served: usize = served.values().sum();
        let mut per_target: Vec<usize> = Vec::new();
        for r in recs {
            if per_target.len() <= r.gateway {
                per_target.resize(r.gateway + 1, 0);
            }
            per_target[r.gateway] += 1;
        }
        let share = served
            .iter()
            .map(|(k, &v)| (k.clone(), v as f64 / total_served.max(1) as f64))
            .collect();
        let prompt_tokens: u64 = ok.iter().filter_map(|r| r.prompt_tokens).sum();
        let cached_tokens: u64 = ok.iter().filter_map(|r| r.cached_tokens).sum();
        let mut error_samples: BTreeMap<String, usize> = BTreeMap::new();
        for e in recs
            .iter()
            .filter(|r| r.outcome == Outcome::Error)
            .filter_map(|r| r.error.as_ref())
        {
            let key: String = e.chars().take(160).collect();
            if error_samples.len() < 5 || error_samples.contains_key(&key) {
                *error_samples.entry(key).or_default() += 1;
            }
        }
        let runtime_s = run.runtime.as_secs_f64();
        let e2e = Stats::of(ok.iter().map(|r| r.e2e_ms));
        Report {
            workload: workload.to_string(),
            target: target.to_string(),
            requests: recs.len(),
            ok: ok.len(),
            errors,
            shed,
            aborted,
            skipped: run.skipped,
            runtime_s,
            started_unix_ms: run.started_unix_ms,
            throughput_rps: if runtime_s > 0.0 {
                ok.len() as f64 / runtime_s
            } else {
                0.0
            },
            hit_rate: fleet_hit_rate(&backends),
            usage_hit_rate: (prompt_tokens > 0)
                .then(|| cached_tokens as f64 / prompt_tokens as f64),
            prompt_tokens,
            cached_tokens,
            ttft_ms: Stats::of(ok.iter().filter_map(|r| r.ttft_ms)),
            e2e_ms: e2e,
            step_ms: if agent_steps { e2e } else { None },
            share,
            served,
            per_target,
            backends,
            client_cpu_s,
            client_cpu_util: if runtime_s > 0.0 {
                client_cpu_s / runtime_s
            } else {
                0.0
            },
            error_samples,
            classes,
        }
    }

    /// Human-readable summary.
    pub fn human(&self) -> String {
        let mut s = String::new();
        let pct = |x: Option<f64>| x.map_or("n/a".to_string(), |v| format!("{:.1}%", v * 100.0));
        let _ = writeln!(
            s,
            "warmroute-loadgen: workload={} target={}",
            self.workload, self.target
        );
        let _ = writeln!(
            s,
            "  requests {}  ok {}  errors {}  shed {}  aborted {}  skipped {}  runtime {:.2}s  ({:.1} req/s)",
            self.requests, self.ok, self.errors, self.shed, self.aborted, self.skipped, self.runtime_s, self.throughput_rps
        );
        for (name, c) in &self.classes {
            let ttft = c.ttft_ms.map_or("n/a".to_string(), |t| {
                format!("p50 {:.1} p95 {:.1} p99 {:.1}", t.p50, t.p95, t.p99)
            });
            let _ = writeln!(
                s,
                "  class {name:<12} sent {} ok {} shed {} failed {} aborted {} unsent {} (lost {})  TTFT ms {ttft}  {:.0} output tok/s over {:.1}s",
                c.requests, c.ok, c.shed, c.errors, c.aborted, c.skipped, c.lost, c.output_tokens_per_s, c.span_s
            );
        }
        let _ = writeln!(
            s,
            "  fleet prefix-cache hit rate {} (metrics)   {} (usage: {} of {} prompt tokens cached)",
            pct(self.hit_rate),
            pct(self.usage_hit_rate),
            self.cached_tokens,
            self.prompt_tokens
        );
        let line = |name: &str, st: &Option<Stats>| {
            match st {
            Some(t) => format!(
                "  {name:<5} ms  mean {:>8.1}  p50 {:>8.1}  p95 {:>8.1}  p99 {:>8.1}  max {:>8.1}  (n={})\n",
                t.mean, t.p50, t.p95, t.p99, t.max, t.n
            ),
            None => format!("  {name:<5} ms  n/a\n"),
        }
        };
        s.push_str(&line("TTFT", &self.ttft_ms));
        s.push_str(&line("e2e", &self.e2e_ms));
        if self.step_ms.is_some() {
            s.push_str(&line("step", &self.step_ms));
        }
        let _ = writeln!(s, "  served by:");
        for (k, n) in &self.served {
            let share = self.share.get(k).copied().unwrap_or(0.0);
            let _ = writeln!(s, "    {k:<24} {n:>6}  {:>5.1}%", share * 100.0);
        }
        if !self.backends.is_empty() {
            let _ = writeln!(s, "  backends (metrics delta):");
            for b in &self.backends {
                match (&b.error, b.hits, b.queries) {
                    (Some(e), _, _) => {
                        let _ = writeln!(s, "    {:<28} scrape failed: {e}", b.url);
                    }
                    (None, Some(h), Some(q)) => {
                        let _ = writeln!(
                            s,
                            "    {:<28} hits {h:>10.0} / queries {q:>10.0}  = {}",
                            b.url,
                            pct(b.hit_rate)
                        );
                    }
                    _ => {}
                }
            }
        }
        for (e, n) in &self.error_samples {
            let _ = writeln!(s, "  error x{n}: {e}");
        }
        let _ = writeln!(
            s,
            "  client CPU {:.2}s ({:.0}% of one core)",
            self.client_cpu_s,
            self.client_cpu_util * 100.0
        );
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runner::RequestRecord;
    use std::time::Duration;

    #[test]
    fn percentile_math() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 0.0), Some(1.0));
        assert_eq!(percentile(&v, 100.0), Some(100.0));
        assert!((percentile(&v, 50.0).unwrap() - 50.5).abs() < 1e-9);
        assert!((percentile(&v, 95.0).unwrap() - 95.05).abs() < 1e-9);
        assert!((percentile(&v, 99.0).unwrap() - 99.01).abs() < 1e-9);
        assert_eq!(percentile(&[7.0], 95.0), Some(7.0));
        assert_eq!(percentile(&[], 50.0), None);
        assert_eq!(percentile(&[0.0, 10.0], 25.0), Some(2.5));
        let s = Stats::of([3.0, 1.0, 2.0, f64::NAN]).unwrap();
        assert_eq!((s.n, s.mean, s.p50, s.max), (3, 2.0, 2.0, 3.0));
        assert!(Stats::of([]).is_none());
    }

    fn rec(outcome: Outcome, replica: Option<&str>, e2e: f64) -> RequestRecord {
        RequestRecord {
            session: "s".into(),
            step: 0,
            class: None,
            start_ms: 0.0,
            gateway: 0,
            outcome,
            status: replica.map(|_| 200),
            ttft_ms: Some(e2e / 2.0),
            e2e_ms: e2e,
            replica: replica.map(str::to_string),
            prompt_words: 10,
            prompt_tokens: Some(100),
            cached_tokens: Some(25),
            completion_tokens: Some(1),
            events: 2,
            error: (outcome != Outcome::Ok).then(|| "boom".to_string()),
            oracle: None,
        }
    }

    #[test]
    fn report_counts_and_shares() {
        let run = RunResult {
            records: vec![
                rec(Outcome::Ok, Some("a"), 10.0),
                rec(Outcome::Ok, Some("a"), 20.0),
                rec(Outcome::Ok, Some("b"), 30.0),
                rec(Outcome::Error, None, 1.0),
                rec(Outcome::Aborted, None, 1.0),
            ],
            skipped: 2,
            skipped_by_class: BTreeMap::new(),
            runtime: Duration::from_secs(2),
            started_unix_ms: 1.0e12,
        };
        let r = Report::build("agent", "http://t", true, &run, vec![], 0.5);
        assert_eq!(
            (r.requests, r.ok, r.errors, r.aborted, r.skipped),
            (5, 3, 1, 1, 2)
        );
        assert!((r.share["a"] - 2.0 / 3.0).abs() < 1e-9);
        assert_eq!(r.e2e_ms.unwrap().mean, 20.0);
        assert_eq!(r.step_ms, r.e2e_ms);
        assert_eq!(r.usage_hit_rate, Some(0.25));
        assert_eq!(r.error_samples["boom"], 1);
        assert_eq!(r.client_cpu_util, 0.25);
        let j = serde_json::to_value(&r).unwrap();
        for k in [
            "hit_rate",
            "ttft_ms",
            "e2e_ms",
            "step_ms",
            "runtime_s",
            "errors",
            "requests",
            "share",
            "client_cpu_s",
        ] {
            assert!(j.get(k).is_some(), "{k}");
        }
        assert!(j["ttft_ms"]["p99"].is_number());
        assert_eq!(j["started_unix_ms"], 1.0e12);
        assert!(r.human().contains("served by"));
        assert!(process_cpu_seconds() > 0.0);
        assert!(j.get("classes").is_none(), "no class, no breakdown");
    }

    #[test]
    fn classes_count_sheds_apart_from_losses_and_rate_their_tokens() {
        let tagged = |class: &str, outcome, start_ms, e2e_ms, tokens| RequestRecord {
            class: Some(class.to_string()),
            start_ms,
            completion_tokens: Some(tokens),
            status: Some(if outcome == Outcome::Shed { 429 } else { 200 }),
            ..rec(outcome, Some("a"), e2e_ms)
        };
        let run = RunResult {
            records: vec![
                tagged("batch", Outcome::Ok, 0.0, 1000.0, 300),
                tagged("batch", Outcome::Ok, 500.0, 1500.0, 300),
                tagged("batch", Outcome::Aborted, 2000.0, 10.0, 0),
                tagged("interactive", Outcome::Ok, 100.0, 40.0, 7),
                tagged("interactive", Outcome::Shed, 200.0, 5.0, 0),
                tagged("interactive", Outcome::Error, 300.0, 5.0, 0),
                rec(Outcome::Ok, Some("a"), 10.0),
            ],
            skipped: 3,
            skipped_by_class: BTreeMap::from([("batch".to_string(), 2), ("x".to_string(), 1)]),
            runtime: Duration::from_secs(3),
            started_unix_ms: 0.0,
        };
        let r = Report::build("mixed", "http://t", false, &run, vec![], 0.1);
        assert_eq!((r.ok, r.errors, r.shed, r.aborted), (4, 1, 1, 1));
        let b = &r.classes["batch"];
        assert_eq!(
            (b.requests, b.ok, b.shed, b.errors, b.aborted, b.skipped, b.lost),
            (3, 2, 0, 0, 1, 2, 3)
        );
        // 600 tokens from the first start (0 ms) to the last end (2000 ms).
        assert_eq!(
            (b.output_tokens, b.span_s, b.output_tokens_per_s),
            (600, 2.0, 300.0)
        );
        let i = &r.classes["interactive"];
        assert_eq!(
            (i.requests, i.ok, i.shed, i.errors, i.lost),
            (3, 1, 1, 1, 1)
        );
        assert_eq!(i.ttft_ms.unwrap().n, 1);
        assert_eq!(i.ttft_ms.unwrap().p95, 20.0);
        // A class never sent at all still shows, as lost.
        assert_eq!((r.classes["x"].requests, r.classes["x"].lost), (0, 1));
        assert_eq!(r.classes["x"].output_tokens_per_s, 0.0);
        assert_eq!(r.classes.len(), 3);
        let j = serde_json::to_value(&r).unwrap();
        assert_eq!(j["classes"]["batch"]["lost"], 3);
        assert_eq!(j["shed"], 1);
        assert!(r.human().contains("class interactive"));
    }
}
