//! Which pods may serve a request's `model`, and, for a LoRA adapter, which
//! of them to prefer.
//!
//! ```text
//! serves(b, m)  = m ∈ declared models or adapters of b     (backends[].models/adapters, pool.*)
//!               ∨ m ∈ adapters b has loaded                (its vllm:lora_requests_info)
//!               ∨ b declares nothing                       (unknown: anything may go there)
//! no member serves m, and every member declares  ⇒  404, OpenAI's error shape
//! candidates    = members with serves(b, m); the others are never chosen
//! for an adapter (m declared or seen as one), in order, the first non-empty:
//!   loaded   = candidates with m running or waiting there, not saturated
//!   free     = candidates with fewer adapters active than max_lora, not saturated
//!   then every candidate
//! ```
//! The tier is the set the strategy then weighs by prefix match and load, like
//! any request's: an adapter's requests stay on the pods that have it loaded
//! (no adapter swap, whose load stalls a batch in vLLM) until those saturate,
//! then go where a slot is free, and only then anywhere that serves it.
//!
//! LoRA state comes from each pod's `/metrics`: vLLM's `vllm:lora_requests_info`
//! gauge, whose labels `running_lora_adapters` and `waiting_lora_adapters` list
//! adapter names (comma-separated) and `max_lora` the slots; a new label set
//! is a new series, so the one with the latest value (a timestamp) is current.
//! The scraping VM shares it per slot; each VM re-reads it at its tick.

use crate::codec::{put, Reader};
use crate::config::Serves;
use crate::load::BackendLoad;
use crate::prometheus::Sample;

/// A pod's LoRA adapters as its last scrape reported them.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Lora {
    /// Adapters in the running batch.
    pub running: Vec<String>,
    /// Adapters of waiting requests.
    pub waiting: Vec<String>,
    /// Adapters it can hold at once.
    pub max_lora: u32,
}

impl Lora {
    /// Whether `adapter` is running or waiting there.
    pub fn loaded(&self, adapter: &str) -> bool {
        self.running
            .iter()
            .chain(&self.waiting)
            .any(|a| a == adapter)
    }

    /// Whether one more adapter fits.
    pub fn free_slot(&self) -> bool {
        let mut active: Vec<&str> = self
            .running
            .iter()
            .chain(&self.waiting)
            .map(String::as_str)
            .collect();
        active.sort_unstable();
        active.dedup();
        (active.len() as u64) < u64::from(self.max_lora)
    }

    /// The current `vllm:lora_requests_info` series among `samples`, if any.
    pub fn from_samples<'a>(samples: impl Iterator<Item = &'a Sample<'a>>) -> Option<Lora> {
        let latest = samples
            .filter(|s| s.name == "vllm:lora_requests_info")
            .max_by(|a, b| a.value.total_cmp(&b.value))?;
        let list = |label: &str| -> Vec<String> {
            latest
                .label(label)
                .map(|v| {
                    v.split(',')
                        .map(str::trim)
                        .filter(|a| !a.is_empty())
                        .map(String::from)
                        .collect()
                })
                .unwrap_or_default()
        };
        Some(Lora {
            running: list("running_lora_adapters"),
            waiting: list("waiting_lora_adapters"),
            max_lora: latest
                .label("max_lora")
                .and_then(|m| m.trim().parse().ok())
                .unwrap_or(0),
        })
    }
}

/// What a request's model allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fit {
    /// Some member serves it; the loads are narrowed to where it should go.
    Served,
    /// No member serves it, and every member says what it serves.
    Unknown,
}

/// Narrows `loads` to the members that serve `model` (see the module doc):
/// others stop being members; for an adapter, members outside the preferred
/// tier stop being healthy, so they are chosen only if the tier is empty.
pub fn narrow<'s>(
    model: &str,
    serves: impl Fn(usize) -> Option<&'s Serves>,
    lora: &[Option<Lora>],
    loads: &mut [BackendLoad],
) -> Fit {
    let n = loads.len();
    let lora_of = |b: usize| lora.get(b).and_then(Option::as_ref);
    let loaded = |b: usize| lora_of(b).is_some_and(|l| l.loaded(model));
    let declared = |b: usize| serves(b).and_then(|s| s.knows(model));
    let candidate: Vec<bool> = (0..n)
        .map(|b| loads[b].member && (declared(b) != Some(false) || loaded(b)))
        .collect();
    if !candidate.iter().any(|&c| c) {
        let all_declared = (0..n).all(|b| !loads[b].member || declared(b).is_some());
        if all_declared && loads.iter().any(|l| l.member) {
            return Fit::Unknown;
        }
        return Fit::Served;
    }
    for (l, &c) in loads.iter_mut().zip(&candidate) {
        if !c {
            l.member = false;
            l.healthy = false;
        }
    }
    let adapter = (0..n)
        .any(|b| loaded(b) || serves(b).is_some_and(|s| s.adapters.iter().any(|a| a == model)));
    if adapter {
        let open = |b: usize| candidate[b] && loads[b].healthy && !loads[b].saturated;
        let loaded_tier: Vec<bool> = (0..n).map(|b| open(b) && loaded(b)).collect();
        let free_tier: Vec<bool> = (0..n)
            .map(|b| open(b) && lora_of(b).is_some_and(Lora::free_slot))
            .collect();
        let tier = [loaded_tier, free_tier]
            .into_iter()
            .find(|t| t.iter().any(|&x| x));
        if let Some(tier) = tier {
            for (l, &t) in loads.iter_mut().zip(&tier) {
                l.healthy &= t;
            }
        }
    }
    Fit::Served
}

/// Most adapters per list kept from a scrape, and the longest name: a broken
/// or hostile `/metrics` cannot make the shared record every VM re-reads large.
pub const MAX_ADAPTERS: usize = 64;
/// Longest adapter name kept (as `models`/`adapters` in the configuration).
pub const MAX_NAME_BYTES: usize = 256;

/// Encodes every slot's LoRA state for shared data.
pub fn encode_lora(all: &[Option<Lora>]) -> Vec<u8> {
    let mut out = Vec::new();
    put(&mut out, all.len() as u32);
    for l in all {
        put(&mut out, l.is_some() as u8);
        let Some(l) = l else { continue };
        put(&mut out, l.max_lora);
        for list in [&l.running, &l.waiting] {
            let kept: Vec<&String> = list
                .iter()
                .filter(|a| a.len() <= MAX_NAME_BYTES)
                .take(MAX_ADAPTERS)
                .collect();
            put(&mut out, kept.len() as u16);
            for a in kept {
                put(&mut out, a.len() as u16);
                out.extend_from_slice(a.as_bytes());
            }
        }
    }
    out
}

/// Decodes `n` slots' LoRA state; another size or a damaged record reads as none.
pub fn decode_lora(bytes: &[u8], n: usize) -> Vec<Option<Lora>> {
    fn read(r: &mut Reader<'_>, n: usize) -> Option<Vec<Option<Lora>>> {
        if r.get::<u32>()? as usize != n {
            return None;
        }
        let mut all = Vec::with_capacity(n);
        for _ in 0..n {
            if r.get::<u8>()? == 0 {
                all.push(None);
                continue;
            }
            let max_lora = r.get()?;
            let mut lists = [Vec::new(), Vec::new()];
            for list in &mut lists {
                for _ in 0..r.get::<u16>()? {
                    let len = r.get::<u16>()? as usize;
                    list.push(String::from_utf8(r.take(len)?.to_vec()).ok()?);
                }
            }
            let [running, waiting] = lists;
            all.push(Some(Lora {
                running,
                waiting,
                max_lora,
            }));
        }
        r.is_empty().then_some(all)
    }
    read(&mut Reader::new(bytes), n).unwrap_or_else(|| vec![None; n])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prometheus;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn lora_of(text: &str) -> Option<Lora> {
        let mut samples = Vec::new();
        prometheus::parse(text, |s| samples.push(s));
        Lora::from_samples(samples.iter())
    }

    fn member() -> BackendLoad {
        BackendLoad {
            member: true,
            healthy: true,
            ..BackendLoad::default()
        }
    }

    /// `narrow` over a table of what each slot serves.
    fn narrow_in(
        model: &str,
        table: &[Option<&Serves>],
        lora: &[Option<Lora>],
        loads: &mut [BackendLoad],
    ) -> Fit {
        narrow(model, |b| table.get(b).copied().flatten(), lora, loads)
    }

    fn serves(models: &[&str], adapters: &[&str]) -> Serves {
        Serves {
            models: models.iter().map(|m| m.to_string()).collect(),
            adapters: adapters.iter().map(|m| m.to_string()).collect(),
        }
    }

    fn state(loads: &[BackendLoad]) -> Vec<(bool, bool)> {
        loads.iter().map(|l| (l.member, l.healthy)).collect()
    }

    #[test]
    fn the_latest_lora_series_is_read() {
        let text = "# TYPE vllm:lora_requests_info gauge\n\
vllm:lora_requests_info{max_lora=\"2\",running_lora_adapters=\"old\",waiting_lora_adapters=\"\"} 1.7e9\n\
vllm:lora_requests_info{max_lora=\"2\",running_lora_adapters=\"sql,chat\",waiting_lora_adapters=\"law\"} 1.8e9\n";
        let l = lora_of(text).unwrap();
        assert_eq!(
            (l.running.clone(), l.waiting.clone(), l.max_lora),
            (
                vec!["sql".to_string(), "chat".to_string()],
                vec!["law".to_string()],
                2
            )
        );
        assert!(l.loaded("law") && !l.loaded("old") && !l.free_slot());
        assert_eq!(lora_of("vllm:num_requests_running 1\n"), None);
    }

    #[test]
    fn requests_go_only_where_their_model_is_served() {
        let a = serves(&["llama"], &[]);
        let b = serves(&["qwen"], &[]);
        let table = [Some(&a), Some(&b), Some(&a)];
        let mut loads = vec![member(); 3];
        assert_eq!(narrow_in("qwen", &table, &[], &mut loads), Fit::Served);
        assert_eq!(
            state(&loads),
            vec![(false, false), (true, true), (false, false)]
        );
        let mut loads = vec![member(); 3];
        assert_eq!(narrow_in("mistral", &table, &[], &mut loads), Fit::Unknown);
        // A pod that declares nothing may serve anything: no 404 then.
        let table = [Some(&a), None, Some(&a)];
        let mut loads = vec![member(); 3];
        assert_eq!(narrow_in("mistral", &table, &[], &mut loads), Fit::Served);
        assert_eq!(
            state(&loads),
            vec![(false, false), (true, true), (false, false)]
        );
        // An empty slot is no member and says nothing.
        let mut loads = vec![member(), BackendLoad::default(), member()];
        assert_eq!(
            narrow_in("qwen", &[Some(&a), None, Some(&a)], &[], &mut loads),
            Fit::Unknown
        );
    }

    #[test]
    fn adapter_requests_prefer_pods_that_have_it_loaded_then_a_free_slot() {
        let base = serves(&["llama"], &["sql"]);
        let table = [Some(&base); 3];
        let lora = |running: &[&str], max: u32| {
            Some(Lora {
                running: running.iter().map(|a| a.to_string()).collect(),
                waiting: vec![],
                max_lora: max,
            })
        };
        let states = [lora(&["chat"], 1), lora(&["sql"], 1), lora(&[], 1)];
        let mut loads = vec![member(); 3];
        narrow_in("sql", &table, &states, &mut loads);
        assert_eq!(
            state(&loads),
            vec![(true, false), (true, true), (true, false)]
        );
        // Saturated where it is loaded: a pod with a free slot next.
        let mut loads = vec![member(); 3];
        loads[1].saturated = true;
        narrow_in("sql", &table, &states, &mut loads);
        assert_eq!(
            state(&loads),
            vec![(true, false), (true, false), (true, true)]
        );
        // Nowhere loaded, no free slot: every pod that can serve it.
        let full = [lora(&["chat"], 1), lora(&["law"], 1), lora(&["x"], 1)];
        let mut loads = vec![member(); 3];
        narrow_in("sql", &table, &full, &mut loads);
        assert_eq!(state(&loads), vec![(true, true); 3]);
        // A base-model request is not narrowed by adapters.
        let mut loads = vec![member(); 3];
        narrow_in("llama", &table, &states, &mut loads);
        assert_eq!(state(&loads), vec![(true, true); 3]);
        // An adapter loaded on a pod that did not declare it is still served there.
        let plain = serves(&["llama"], &[]);
        let mut loads = vec![member(); 2];
        let fit = narrow_in(
            "dyn",
            &[Some(&plain), Some(&plain)],
            &[lora(&["dyn"], 2), None],
            &mut loads,
        );
        assert_eq!(fit, Fit::Served);
        assert_eq!(state(&loads), vec![(true, true), (false, false)]);
    }

    #[test]
    fn hostile_adapter_lists_are_bounded_and_never_spoil_the_record() {
        let long = "é".repeat(200); // 400 bytes: dropped whole, never cut mid-character
        let mut running: Vec<String> = (0..500).map(|i| format!("a{i}")).collect();
        running.insert(0, long);
        let all = vec![
            Some(Lora {
                running,
                waiting: vec![],
                max_lora: 1,
            }),
            None,
        ];
        let back = decode_lora(&encode_lora(&all), 2);
        let kept = &back[0].as_ref().unwrap().running;
        assert_eq!(kept.len(), MAX_ADAPTERS);
        assert_eq!(kept[0], "a0");
    }

    #[test]
    fn lora_state_round_trips_and_rejects_other_shapes() {
        let all = vec![
            Some(Lora {
                running: vec!["a".into(), "b".into()],
                waiting: vec!["c".into()],
                max_lora: 4,
            }),
            None,
            Some(Lora::default()),
        ];
        let bytes = encode_lora(&all);
        assert_eq!(decode_lora(&bytes, 3), all);
        assert_eq!(decode_lora(&bytes, 2), vec![None, None]);
        assert_eq!(decode_lora(&bytes[..bytes.len() - 1], 3), vec![None; 3]);
    }
}
