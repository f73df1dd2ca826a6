//! The `uniform` workload: independent requests sharing no prefix.
//!
//! `requests` one-request sessions arrive as a Poisson process of `rate` per
//! second, each a prompt of `prompt_tokens` random words that begins with the
//! word `req{i}`, unique to the request, so no two prompts share even one
//! cached block. It is the baseline where prefix-aware routing cannot help and
//! should cost nothing.

use std::time::Duration;

use anyhow::{bail, Result};

use super::render::{push_words, render};
use super::{ms, Api, RenderOpts, Request, Session, Workload};
use crate::rng::Rng;

/// Options of the `uniform` workload.
#[derive(Clone, Debug)]
pub struct UniformOpts {
    /// Number of requests.
    pub requests: usize,
    /// Arrival rate (requests/s, Poisson).
    pub rate: f64,
    /// Prompt length (tokens).
    pub prompt_tokens: usize,
    /// `max_tokens`.
    pub output_tokens: u32,
    /// Endpoint.
    pub api: Api,
    /// Seed.
    pub seed: u64,
}

impl Default for UniformOpts {
    fn default() -> Self {
        Self {
            requests: 200,
            rate: 20.0,
            prompt_tokens: 512,
            output_tokens: 32,
            api: Api::Completions,
            seed: 42,
        }
    }
}

/// Build the `uniform` workload: independent random prompts, no shared prefix
/// (each prompt starts with a word unique to the request).
pub fn uniform(opts: &UniformOpts, render_opts: &RenderOpts) -> Result<Workload> {
    if opts.rate <= 0.0 || !opts.rate.is_finite() {
        bail!("--rate must be > 0");
    }
    let root = Rng::new(opts.seed);
    let mut arrivals = root.fork(u64::MAX);
    let mut t_ms = 0.0;
    let max_tokens = opts.output_tokens.max(1);
    let mut sessions = Vec::with_capacity(opts.requests);
    for i in 0..opts.requests {
        if i > 0 {
            t_ms += arrivals.exponential(1000.0 / opts.rate);
        }
        let mut rng = root.fork(i as u64);
        let mut prompt = format!("req{i}");
        push_words(&mut prompt, &mut rng, opts.prompt_tokens.saturating_sub(1));
        sessions.push(Session {
            id: format!("uniform-{i}"),
            start: ms(t_ms),
            requests: vec![Request {
                api: opts.api,
                body: render(render_opts, opts.api, &prompt, max_tokens)?,
                headers: Vec::new(),
                think: Duration::ZERO,
                prompt_words: opts.prompt_tokens.max(1),
                max_tokens,
            }],
        });
    }
    Ok(Workload {
        name: "uniform",
        sessions,
        agent_steps: false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::tests::prompt_of;

    #[test]
    fn uniform_shares_nothing() {
        let u = uniform(
            &UniformOpts {
                requests: 50,
                prompt_tokens: 20,
                ..Default::default()
            },
            &RenderOpts::default(),
        )
        .unwrap();
        let prompts: Vec<String> = u
            .sessions
            .iter()
            .map(|s| prompt_of(&s.requests[0]))
            .collect();
        for (i, p) in prompts.iter().enumerate() {
            assert_eq!(p.split_whitespace().count(), 20);
            // Lines of 12 words, as real text has line breaks (JSON escapes).
            assert_eq!(p.lines().count(), 2, "{p:?}");
            for q in &prompts[i + 1..] {
                assert_ne!(p.split_whitespace().next(), q.split_whitespace().next());
            }
        }
    }
}
