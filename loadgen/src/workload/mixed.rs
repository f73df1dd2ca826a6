//! The `mixed` workload: interactive chat alongside long batch jobs, each
//! request tagged with its priority class, to load a fleet past its capacity
//! and see who waits.
//!
//! - **Batch**: `batch_workers` closed-loop workers start at time 0 and each
//!   sends `batch_jobs` jobs back to back (no think time): a prompt of
//!   `batch_prompt_tokens` words unique to the job (it begins with the word
//!   `batch{w}j{j}`, so jobs share no cached block) asking for
//!   `batch_output_tokens`, or, with `batch_output_sigma` > 0, a
//!   log-normal(`batch_output_tokens`, `batch_output_sigma`) number of them,
//!   clamped to `[1, 4 × batch_output_tokens]`. More workers than the fleet has batch slots keep
//!   every pod full and a queue behind it, as an offline job runner does.
//! - **Interactive**: `interactive` one-turn chats arrive as a Poisson process
//!   of `rate` per second from `interactive_start_ms` on (after the batch
//!   workers have filled the fleet): a shared `system_tokens` system prompt and
//!   a user message of log-normal(`user_median`, 0.6) words, clamped to
//!   `[1, 8192]`, answered in at most `output_tokens`.
//!
//! Every request carries [`PRIORITY_HEADER`]: `interactive` or `batch`. The
//! runner records it as the request's class and the report breaks results down
//! by class (TTFT, output tokens per second, answered / shed / failed /
//! aborted / never sent). Requests sent: `interactive + batch_workers *
//! batch_jobs`, all decided by the seed.

use std::time::Duration;

use anyhow::{bail, Result};

use super::render::{push_words, render_chat, words};
use super::{ms, Api, Message, RenderOpts, Request, Session, Workload};
use crate::rng::Rng;

/// The header naming a request's priority class (warmroute's gate reads it).
pub const PRIORITY_HEADER: &str = "x-warmroute-priority";

/// Class of the interactive requests.
pub const INTERACTIVE: &str = "interactive";

/// Class of the batch jobs.
pub const BATCH: &str = "batch";

/// Options of the `mixed` workload.
#[derive(Clone, Debug)]
pub struct MixedOpts {
    /// Interactive requests.
    pub interactive: usize,
    /// Interactive arrival rate (requests/s, Poisson).
    pub rate: f64,
    /// When the first interactive request arrives (ms from the run start).
    pub interactive_start_ms: f64,
    /// Shared system prompt of the interactive requests (tokens).
    pub system_tokens: usize,
    /// Median interactive user message (tokens, log-normal, sigma 0.6).
    pub user_median: f64,
    /// Interactive `max_tokens`.
    pub output_tokens: u32,
    /// Closed-loop batch workers.
    pub batch_workers: usize,
    /// Jobs each batch worker sends, one after the other.
    pub batch_jobs: usize,
    /// Batch prompt length (tokens).
    pub batch_prompt_tokens: usize,
    /// Batch `max_tokens` (the median when `batch_output_sigma` > 0).
    pub batch_output_tokens: u32,
    /// Log-normal sigma of batch `max_tokens` (0: every job asks for the same).
    pub batch_output_sigma: f64,
    /// Seed.
    pub seed: u64,
}

impl Default for MixedOpts {
    fn default() -> Self {
        Self {
            interactive: 100,
            rate: 10.0,
            interactive_start_ms: 500.0,
            system_tokens: 256,
            user_median: 60.0,
            output_tokens: 48,
            batch_workers: 8,
            batch_jobs: 4,
            batch_prompt_tokens: 1024,
            batch_output_tokens: 128,
            batch_output_sigma: 0.0,
            seed: 42,
        }
    }
}

fn tagged(class: &str, messages: &[Message], max_tokens: u32, ro: &RenderOpts) -> Result<Request> {
    Ok(Request {
        api: Api::Chat,
        body: render_chat(ro, messages, max_tokens)?,
        headers: vec![(PRIORITY_HEADER.into(), class.into())],
        think: Duration::ZERO,
        prompt_words: super::render::messages_words(messages),
        max_tokens,
    })
}

/// Build the `mixed` workload: batch worker sessions first (all start at 0),
/// then the interactive requests in arrival order.
pub fn mixed(opts: &MixedOpts, render_opts: &RenderOpts) -> Result<Workload> {
    if opts.rate <= 0.0 || !opts.rate.is_finite() {
        bail!("--rate must be > 0");
    }
    if !opts.interactive_start_ms.is_finite() || opts.interactive_start_ms < 0.0 {
        bail!("--interactive-start-ms must be >= 0");
    }
    if !opts.batch_output_sigma.is_finite() || opts.batch_output_sigma < 0.0 {
        bail!("--batch-output-sigma must be >= 0");
    }
    let root = Rng::new(opts.seed);
    let mut sessions = Vec::with_capacity(opts.batch_workers + opts.interactive);
    let batch_max = opts.batch_output_tokens.max(1);
    for w in 0..opts.batch_workers {
        let mut rng = root.fork((1u64 << 32) | w as u64);
        let mut requests = Vec::with_capacity(opts.batch_jobs);
        for j in 0..opts.batch_jobs {
            let mut prompt = format!("batch{w}j{j}");
            push_words(
                &mut prompt,
                &mut rng,
                opts.batch_prompt_tokens.saturating_sub(1),
            );
            let msg = [Message::text("user", prompt)];
            let max_tokens = if opts.batch_output_sigma > 0.0 {
                let cap = f64::from(batch_max) * 4.0;
                rng.lognormal(f64::from(batch_max), opts.batch_output_sigma)
                    .round()
                    .clamp(1.0, cap) as u32
            } else {
                batch_max
            };
            requests.push(tagged(BATCH, &msg, max_tokens, render_opts)?);
        }
        sessions.push(Session {
            id: format!("batch-{w}"),
            start: Duration::ZERO,
            requests,
        });
    }
    let system = Message::text(
        "system",
        format!(
            "You are a helpful assistant. {}",
            words(&mut root.fork(u64::MAX), opts.system_tokens)
        ),
    );
    let mut arrivals = root.fork(u64::MAX - 1);
    let mut t_ms = opts.interactive_start_ms;
    let max_tokens = opts.output_tokens.max(1);
    for i in 0..opts.interactive {
        if i > 0 {
            t_ms += arrivals.exponential(1000.0 / opts.rate);
        }
        let mut rng = root.fork(i as u64);
        let len = (rng.lognormal(opts.user_median, 0.6).round() as usize).clamp(1, 8192);
        let msgs = [system.clone(), Message::text("user", words(&mut rng, len))];
        sessions.push(Session {
            id: format!("interactive-{i}"),
            start: ms(t_ms),
            requests: vec![tagged(INTERACTIVE, &msgs, max_tokens, render_opts)?],
        });
    }
    Ok(Workload {
        name: "mixed",
        sessions,
        agent_steps: false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::tests::body_json;

    fn class(r: &Request) -> &str {
        r.headers
            .iter()
            .find(|(k, _)| k == PRIORITY_HEADER)
            .map_or("", |(_, v)| v.as_str())
    }

    #[test]
    fn batch_workers_loop_and_interactive_chats_arrive_after_the_start() {
        let o = MixedOpts {
            interactive: 30,
            batch_workers: 3,
            batch_jobs: 2,
            batch_prompt_tokens: 40,
            batch_output_tokens: 300,
            interactive_start_ms: 250.0,
            ..Default::default()
        };
        let w = mixed(&o, &RenderOpts::default()).unwrap();
        assert_eq!(w.total_requests(), 30 + 3 * 2);
        let (batch, chat): (Vec<_>, Vec<_>) =
            w.sessions.iter().partition(|s| s.id.starts_with("batch-"));
        assert_eq!((batch.len(), chat.len()), (3, 30));
        let mut firsts = Vec::new();
        for s in &batch {
            assert_eq!(s.start, Duration::ZERO);
            assert_eq!(s.requests.len(), 2);
            for r in &s.requests {
                assert_eq!(class(r), BATCH);
                assert_eq!((r.max_tokens, r.prompt_words), (300, 40));
                assert_eq!(r.think, Duration::ZERO);
                let text = body_json(r)["messages"][0]["content"]
                    .as_str()
                    .unwrap()
                    .to_string();
                assert_eq!(text.split_whitespace().count(), 40);
                firsts.push(text.split_whitespace().next().unwrap().to_string());
            }
        }
        // No two jobs share even their first block.
        firsts.sort();
        firsts.dedup();
        assert_eq!(firsts.len(), 6);
        let system = body_json(&chat[0].requests[0])["messages"][0].clone();
        for p in chat.windows(2) {
            assert!(p[0].start <= p[1].start);
        }
        assert_eq!(chat[0].start, Duration::from_millis(250));
        for s in &chat {
            let r = &s.requests[0];
            assert_eq!(class(r), INTERACTIVE);
            assert_eq!(body_json(r)["messages"][0], system);
            assert!(body_json(r)["stream"].as_bool().unwrap());
        }
        // Poisson at 10/s: 29 gaps average 100 ms (loosely: 2.9 s ± a lot).
        let span = chat[29].start - chat[0].start;
        assert!(
            span > Duration::from_secs(1) && span < Duration::from_secs(6),
            "{span:?}"
        );
    }

    #[test]
    fn bad_rates_and_starts_are_errors() {
        let ro = RenderOpts::default();
        for o in [
            MixedOpts {
                rate: 0.0,
                ..Default::default()
            },
            MixedOpts {
                interactive_start_ms: f64::NAN,
                ..Default::default()
            },
            MixedOpts {
                batch_output_sigma: -1.0,
                ..Default::default()
            },
        ] {
            assert!(mixed(&o, &ro).is_err());
        }
    }

    #[test]
    fn batch_output_lengths_spread_around_their_median_when_asked() {
        let o = MixedOpts {
            interactive: 0,
            batch_workers: 20,
            batch_jobs: 10,
            batch_prompt_tokens: 4,
            batch_output_tokens: 400,
            batch_output_sigma: 0.5,
            ..Default::default()
        };
        let w = mixed(&o, &RenderOpts::default()).unwrap();
        let mut lens: Vec<u32> = w
            .sessions
            .iter()
            .flat_map(|s| s.requests.iter().map(|r| r.max_tokens))
            .collect();
        assert!(lens.iter().all(|&l| (1..=1600).contains(&l)));
        for r in w.sessions.iter().flat_map(|s| &s.requests) {
            assert_eq!(body_json(r)["max_tokens"], r.max_tokens);
        }
        lens.sort_unstable();
        let median = lens[lens.len() / 2];
        assert!((300..=530).contains(&median), "{median}");
        assert!(lens[0] < 250 && lens[lens.len() - 1] > 650, "{lens:?}");
        // Sigma 0: every job asks for the same.
        let fixed = mixed(
            &MixedOpts {
                batch_output_sigma: 0.0,
                ..o
            },
            &RenderOpts::default(),
        )
        .unwrap();
        assert!(fixed
            .sessions
            .iter()
            .flat_map(|s| &s.requests)
            .all(|r| r.max_tokens == 400));
    }
}
