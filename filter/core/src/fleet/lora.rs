//! The LoRA adapters each pod reports, and the shared record that carries
//! them to every VM.
//!
//! LoRA state comes from each pod's `/metrics`: vLLM's `vllm:lora_requests_info`
//! gauge, whose labels `running_lora_adapters` and `waiting_lora_adapters` list
//! adapter names (comma-separated) and `max_lora` the slots; a new label set
//! is a new series, so the one with the latest value (a timestamp) is current.
//! The scraping VM shares it per slot; each VM re-reads it at its tick.
//! Routing prefers the pods that have an adapter loaded
//! ([`crate::routing::models`]).

use crate::codec::{put, Reader};
use crate::fleet::prometheus::Sample;

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

/// Most adapters per list kept from a scrape, and the longest name: a broken
/// or hostile `/metrics` cannot make the shared record every VM re-reads large.
pub const MAX_ADAPTERS: usize = 64;
/// Longest adapter name kept (as `models`/`adapters` in the configuration).
pub use crate::config::MAX_NAME_BYTES;

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
    use crate::fleet::prometheus;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn lora_of(text: &str) -> Option<Lora> {
        let mut samples = Vec::new();
        prometheus::parse(text, |s| samples.push(s));
        Lora::from_samples(samples.iter())
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

    #[test]
    fn the_record_keeps_its_layout() {
        let l = Lora {
            running: vec!["sql".into()],
            waiting: vec!["law".into(), "chat".into()],
            max_lora: 2,
        };
        assert_eq!(
            crate::testing::hex(&encode_lora(&[Some(l), None])),
            "0200000001020000000100030073716c020003006c617704006368617400",
            "lora.v1"
        );
    }
}
