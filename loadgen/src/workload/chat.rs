//! The `chat` workload: users in multi-turn conversations with an assistant.
//!
//! Sessions (users) start as a Poisson process of `rate` per second. Each runs
//! `turns` requests; turn `t` sends the shared system prompt and the whole
//! history so far plus a new user message, so each prompt extends the
//! previous one. User messages are log-normal(`user_median`, 0.6) words,
//! clamped to `[1, 8192]`; the assistant replies in the history are
//! `reply_tokens` synthesised words (also `max_tokens`). Between turns the user
//! thinks Exp(mean `think_ms`). Requests carry `x-session-id: chat-{c}`.

use std::time::Duration;

use anyhow::{bail, Result};

use super::render::words;
use super::{chat_step, ms, Message, RenderOpts, Session, Workload};
use crate::rng::Rng;

/// Options of the `chat` workload.
#[derive(Clone, Debug)]
pub struct ChatOpts {
    /// Number of sessions (users).
    pub sessions: usize,
    /// Turns per session.
    pub turns: usize,
    /// Session arrival rate (sessions/s, Poisson).
    pub rate: f64,
    /// Mean think time between turns (ms, exponential).
    pub think_ms: f64,
    /// Shared system prompt length (tokens).
    pub system_tokens: usize,
    /// Median user message length (tokens, log-normal, sigma 0.6).
    pub user_median: f64,
    /// Assistant reply length (tokens): `max_tokens` and the synthesised history.
    pub reply_tokens: usize,
    /// Seed.
    pub seed: u64,
}

impl Default for ChatOpts {
    fn default() -> Self {
        Self {
            sessions: 24,
            turns: 4,
            rate: 4.0,
            think_ms: 500.0,
            system_tokens: 256,
            user_median: 60.0,
            reply_tokens: 48,
            seed: 42,
        }
    }
}

/// Build the `chat` workload.
pub fn chat(opts: &ChatOpts, render_opts: &RenderOpts) -> Result<Workload> {
    if opts.rate <= 0.0 || !opts.rate.is_finite() {
        bail!("--rate must be > 0");
    }
    let root = Rng::new(opts.seed);
    let mut arrivals = root.fork(u64::MAX - 1);
    let system = Message::text(
        "system",
        format!(
            "You are a helpful assistant. {}",
            words(&mut root.fork(u64::MAX), opts.system_tokens)
        ),
    );
    let max_tokens = opts.reply_tokens.clamp(1, u32::MAX as usize) as u32;
    let mut t_ms = 0.0;
    let mut sessions = Vec::with_capacity(opts.sessions);
    for c in 0..opts.sessions {
        if c > 0 {
            t_ms += arrivals.exponential(1000.0 / opts.rate);
        }
        let mut rng = root.fork(c as u64);
        let id = format!("chat-{c}");
        let mut history = vec![system.clone()];
        let mut requests = Vec::with_capacity(opts.turns);
        for turn in 0..opts.turns {
            let len = (rng.lognormal(opts.user_median, 0.6).round() as usize).clamp(1, 8192);
            history.push(Message::text("user", words(&mut rng, len)));
            let think = if turn == 0 {
                Duration::ZERO
            } else {
                ms(rng.exponential(opts.think_ms))
            };
            requests.push(chat_step(render_opts, &id, &history, think, max_tokens)?);
            history.push(Message::text(
                "assistant",
                words(&mut rng, opts.reply_tokens),
            ));
        }
        sessions.push(Session {
            id,
            start: ms(t_ms),
            requests,
        });
    }
    Ok(Workload {
        name: "chat",
        sessions,
        agent_steps: false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::tests::message_arrays;

    #[test]
    fn chat_turns_extend_history() {
        let w = chat(
            &ChatOpts {
                sessions: 3,
                turns: 3,
                ..Default::default()
            },
            &RenderOpts::default(),
        )
        .unwrap();
        for s in &w.sessions {
            let msgs = message_arrays(s);
            for pair in msgs.windows(2) {
                let (a, b) = (&pair[0], &pair[1]);
                assert_eq!(b.len(), a.len() + 2);
                assert_eq!(&b[..a.len()], &a[..]);
            }
        }
        assert!(w.sessions.windows(2).all(|p| p[0].start <= p[1].start));
    }
}
