//! The LoRA record (`lora.v1`: every slot's adapters) as another VM could
//! have written it, and the adapters a pod's `/metrics` reports, as the
//! scraping VM shares them.
//! Input: a selector (bits 0-2: slot count 0..=7; bit 3: the rest is the
//! record, else `/metrics` text), then the bytes.
//! Invariants: no panic; bounded allocation; a record of `n` slots reads as
//! `n` slots; what decodes re-encodes to a record that decodes the same (of
//! the same length) when its lists are within `MAX_ADAPTERS` and
//! `MAX_NAME_BYTES`, else to one holding them cut to those bounds; a
//! scrape's adapters are shared within the bounds.
#![no_main]

use fuzz_support::bounded;
use libfuzzer_sys::fuzz_target;
use warmroute_core::fleet::lora::{decode_lora, encode_lora, Lora, MAX_ADAPTERS, MAX_NAME_BYTES};
use warmroute_core::fleet::prometheus;

fuzz_target!(|data: &[u8]| {
    let Some((&sel, bytes)) = data.split_first() else {
        return;
    };
    let n = usize::from(sel % 8);
    bounded(bytes.len(), || {
        if sel & 8 != 0 {
            record(bytes, n)
        } else {
            scrape(bytes, n)
        }
    });
});

/// `l` as the record keeps it.
fn bounded_lists(l: &Lora) -> Lora {
    let cut = |list: &[String]| -> Vec<String> {
        list.iter()
            .filter(|a| a.len() <= MAX_NAME_BYTES)
            .take(MAX_ADAPTERS)
            .cloned()
            .collect()
    };
    Lora {
        running: cut(&l.running),
        waiting: cut(&l.waiting),
        max_lora: l.max_lora,
    }
}

fn record(bytes: &[u8], n: usize) {
    let all = decode_lora(bytes, n);
    assert_eq!(all.len(), n);
    for l in all.iter().flatten() {
        let _ = (l.free_slot(), l.loaded("a"));
    }
    let again = encode_lora(&all);
    let kept: Vec<Option<Lora>> = all.iter().map(|l| l.as_ref().map(bounded_lists)).collect();
    assert_eq!(decode_lora(&again, n), kept);
    let valid = all.iter().any(Option::is_some) || bytes == encode_lora(&vec![None; n]);
    if valid && kept == all {
        // Not byte for byte: any presence byte but 0 reads as a pod, written 1.
        assert_eq!(again.len(), bytes.len());
    }
}

fn scrape(bytes: &[u8], n: usize) {
    let text = String::from_utf8_lossy(bytes);
    let mut samples = Vec::new();
    prometheus::parse(&text, |s| {
        if s.name == "vllm:lora_requests_info" {
            samples.push(s)
        }
    });
    let Some(l) = Lora::from_samples(samples.iter()) else {
        return;
    };
    let _ = (l.free_slot(), l.loaded("a"));
    let mut all = vec![None; n.max(1)];
    all[0] = Some(l.clone());
    let back = decode_lora(&encode_lora(&all), all.len());
    let got = back[0].as_ref().expect("a scraped pod's adapters are lost");
    assert_eq!(got, &bounded_lists(&l));
    assert!(got.running.len() <= MAX_ADAPTERS && got.waiting.len() <= MAX_ADAPTERS);
}
