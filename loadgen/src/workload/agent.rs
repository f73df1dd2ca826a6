//! The `agent` workload: tool-calling agents whose context grows step by step.
//!
//! Agent `a` starts at `a · stagger_ms` and runs `steps` requests in sequence.
//! Step `s` sends
//!
//! ```text
//! [system, task_a, (assistant_1, tool_1), …, (assistant_s, tool_s)]
//! ```
//!
//! so every step's prompt is the previous step's plus one assistant turn
//! (`assistant_tokens` words and a tool call) and one tool output, as a coding
//! agent's is. The system prompt is shared by all agents, the task is not. Tool
//! output lengths are log-normal(`tool_median`, `tool_sigma`), clamped to
//! `[1, tool_max]`: mostly short with a heavy tail (large file reads), so some
//! agents' contexts outgrow the others'. Between steps the agent waits
//! Exp(mean `tool_ms`), the tool's run time. Requests carry
//! `x-session-id: agent-{a}`.

use std::time::Duration;

use anyhow::Result;

use super::render::words;
use super::{chat_step, ms, FunctionCall, Message, RenderOpts, Session, ToolCall, Workload};
use crate::rng::Rng;

/// Options of the `agent` workload.
#[derive(Clone, Debug)]
pub struct AgentOpts {
    /// Concurrent agents.
    pub agents: usize,
    /// Sequential steps per agent.
    pub steps: usize,
    /// Shared system prompt length (tokens).
    pub system_tokens: usize,
    /// Per-agent task message length (tokens).
    pub task_tokens: usize,
    /// Synthesised assistant message length per step (tokens), also `max_tokens`.
    pub assistant_tokens: usize,
    /// Median tool output length (tokens); log-normal.
    pub tool_median: f64,
    /// Log-normal shape of tool output lengths.
    pub tool_sigma: f64,
    /// Cap on one tool output (tokens).
    pub tool_max: usize,
    /// Mean simulated tool run time between steps (ms, exponential).
    pub tool_ms: f64,
    /// Agent `i` starts at `i * stagger_ms`.
    pub stagger_ms: f64,
    /// Seed.
    pub seed: u64,
}

impl Default for AgentOpts {
    fn default() -> Self {
        Self {
            agents: 8,
            steps: 6,
            system_tokens: 1024,
            task_tokens: 64,
            assistant_tokens: 32,
            tool_median: 150.0,
            tool_sigma: 1.0,
            tool_max: 2000,
            tool_ms: 50.0,
            stagger_ms: 100.0,
            seed: 42,
        }
    }
}

/// The message lists sent by each agent at each step: `[agent][step] -> messages`.
pub fn agent_conversations(opts: &AgentOpts) -> Vec<Vec<Vec<Message>>> {
    let root = Rng::new(opts.seed);
    let mut sys_rng = root.fork(u64::MAX);
    let system = Message::text(
        "system",
        format!(
            "You are a coding agent. {}",
            words(&mut sys_rng, opts.system_tokens)
        ),
    );
    (0..opts.agents)
        .map(|a| {
            let mut rng = root.fork(a as u64);
            let task = Message::text(
                "user",
                format!("Task {a}: {}", words(&mut rng, opts.task_tokens)),
            );
            let mut history = vec![system.clone(), task];
            let mut steps = Vec::with_capacity(opts.steps);
            for s in 0..opts.steps {
                steps.push(history.clone());
                let call_id = format!("call_{a}_{s}");
                let args = format!("{{\"cmd\":\"{}\"}}", words(&mut rng, 3));
                history.push(Message {
                    role: "assistant".into(),
                    content: words(&mut rng, opts.assistant_tokens),
                    tool_calls: Some(vec![ToolCall {
                        id: call_id.clone(),
                        kind: "function".into(),
                        function: FunctionCall {
                            name: "run".into(),
                            arguments: args,
                        },
                    }]),
                    tool_call_id: None,
                });
                let len = (rng.lognormal(opts.tool_median, opts.tool_sigma).round() as usize)
                    .clamp(1, opts.tool_max.max(1));
                history.push(Message {
                    role: "tool".into(),
                    content: words(&mut rng, len),
                    tool_calls: None,
                    tool_call_id: Some(call_id),
                });
            }
            steps
        })
        .collect()
}

/// Build the `agent` workload.
pub fn agent(opts: &AgentOpts, render_opts: &RenderOpts) -> Result<Workload> {
    let max_tokens = opts.assistant_tokens.clamp(1, u32::MAX as usize) as u32;
    let root = Rng::new(opts.seed);
    let mut sessions = Vec::with_capacity(opts.agents);
    for (a, steps) in agent_conversations(opts).into_iter().enumerate() {
        let mut think_rng = root.fork(1 << 32 | a as u64);
        let id = format!("agent-{a}");
        let mut requests = Vec::with_capacity(steps.len());
        for (s, messages) in steps.iter().enumerate() {
            let think = if s == 0 {
                Duration::ZERO
            } else {
                ms(think_rng.exponential(opts.tool_ms))
            };
            requests.push(chat_step(render_opts, &id, messages, think, max_tokens)?);
        }
        sessions.push(Session {
            id,
            start: ms(a as f64 * opts.stagger_ms),
            requests,
        });
    }
    Ok(Workload {
        name: "agent",
        sessions,
        agent_steps: true,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::render::count_words;
    use crate::workload::tests::message_arrays;

    #[test]
    fn agent_context_grows_and_extends_previous_step() {
        let opts = AgentOpts {
            agents: 3,
            steps: 5,
            ..Default::default()
        };
        let convs = agent_conversations(&opts);
        assert_eq!(convs.len(), 3);
        for steps in &convs {
            assert_eq!(steps.len(), 5);
            for pair in steps.windows(2) {
                let (prev, next) = (&pair[0], &pair[1]);
                assert_eq!(next.len(), prev.len() + 2);
                assert_eq!(&next[..prev.len()], &prev[..]);
                assert_eq!(next[prev.len()].role, "assistant");
                assert_eq!(next[prev.len() + 1].role, "tool");
            }
        }
        // All agents share the system prompt, tasks differ.
        assert_eq!(convs[0][0][0], convs[1][0][0]);
        assert_ne!(convs[0][0][1], convs[1][0][1]);

        let w = agent(&opts, &RenderOpts::default()).unwrap();
        assert!(w.agent_steps);
        for s in &w.sessions {
            let lens: Vec<usize> = s.requests.iter().map(|r| r.prompt_words).collect();
            assert!(lens.windows(2).all(|p| p[1] > p[0]), "{lens:?}");
            assert!(s.requests.iter().all(|r| r
                .headers
                .iter()
                .any(|(k, v)| k == "x-session-id" && v == &s.id)));
            // The rendered bodies carry the same growing message arrays.
            let msgs = message_arrays(s);
            for pair in msgs.windows(2) {
                let (a, b) = (&pair[0], &pair[1]);
                assert_eq!(&b[..a.len()], &a[..]);
            }
        }
    }

    #[test]
    fn tool_outputs_are_skewed() {
        let opts = AgentOpts {
            agents: 20,
            steps: 10,
            ..Default::default()
        };
        let mut lens: Vec<usize> = agent_conversations(&opts)
            .iter()
            .filter_map(|steps| steps.last())
            .flat_map(|m| {
                m.iter()
                    .filter(|m| m.role == "tool")
                    .map(|m| count_words(&m.content))
            })
            .collect();
        lens.sort_unstable();
        let median = lens[lens.len() / 2] as f64;
        let mean = lens.iter().sum::<usize>() as f64 / lens.len() as f64;
        assert!(mean > median * 1.2, "mean {mean} median {median}");
    }
}
