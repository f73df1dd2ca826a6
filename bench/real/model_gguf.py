"""Writes the tiny random-weight GGUF that llama.cpp's server serves in `make real-llama`.

    python model_gguf.py OUT.gguf

The model is `model.py`'s, in llama.cpp's format: the same architecture (a Llama of hidden
256, 4 layers, 4 heads of 64), the same byte-level BPE tokenizer trained with `tokenizers`
on the standard library's docstrings (its vocabulary and merges written as a `gpt2`
tokenizer with the GPT-2 pre-tokenizer, which is what `tokenizers`' ByteLevel splits by),
the same ChatML chat template, and weights drawn from N(0, 0.02) with a fixed seed (the
GGUF carries its weights; there is no `--load-format dummy`). `corpus.txt` beside OUT is
the text the workloads draw their prompts from, as for vLLM. Nothing is downloaded.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
from gguf import GGUFWriter, TokenType

sys.path.insert(0, str(Path(__file__).resolve().parent))
from model import CHAT_TEMPLATE, SPECIAL, TOOL_TOKENS, corpus, train  # noqa: E402

HIDDEN, FFN, LAYERS, HEADS, HEAD_DIM, CTX = 256, 768, 4, 4, 64, 8192


def main(out: Path) -> int:
    out.parent.mkdir(parents=True, exist_ok=True)
    paragraphs = corpus()
    if len(paragraphs) < 2000:
        raise SystemExit(f"only {len(paragraphs)} docstring paragraphs found under the stdlib: too few")
    tok = train(paragraphs)
    spec = json.loads(tok.to_str())
    vocab = tok.get_vocab(with_added_tokens=True)
    n_vocab = max(vocab.values()) + 1
    tokens = [""] * n_vocab
    for t, i in vocab.items():
        tokens[i] = t
    types = [TokenType.CONTROL if t in SPECIAL else TokenType.USER_DEFINED if t in TOOL_TOKENS
             else TokenType.NORMAL for t in tokens]
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]

    w = GGUFWriter(str(out), "llama")
    w.add_name("warmroute-tiny")
    w.add_context_length(CTX)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(FFN)
    w.add_block_count(LAYERS)
    w.add_head_count(HEADS)
    w.add_head_count_kv(HEADS)
    w.add_rope_dimension_count(HEAD_DIM)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(n_vocab)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(vocab["<|endoftext|>"])
    w.add_eos_token_id(vocab["<|im_end|>"])
    w.add_pad_token_id(vocab["<|endoftext|>"])
    w.add_add_bos_token(False)
    w.add_chat_template(CHAT_TEMPLATE)

    rng = np.random.default_rng(31)

    def rand(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    ones = np.ones(HIDDEN, dtype=np.float32)
    w.add_tensor("token_embd.weight", rand(n_vocab, HIDDEN))
    for b in range(LAYERS):
        w.add_tensor(f"blk.{b}.attn_norm.weight", ones)
        for name in ("attn_q", "attn_k", "attn_v"):
            w.add_tensor(f"blk.{b}.{name}.weight", rand(HEADS * HEAD_DIM, HIDDEN))
        w.add_tensor(f"blk.{b}.attn_output.weight", rand(HIDDEN, HEADS * HEAD_DIM))
        w.add_tensor(f"blk.{b}.ffn_norm.weight", ones)
        w.add_tensor(f"blk.{b}.ffn_gate.weight", rand(FFN, HIDDEN))
        w.add_tensor(f"blk.{b}.ffn_up.weight", rand(FFN, HIDDEN))
        w.add_tensor(f"blk.{b}.ffn_down.weight", rand(HIDDEN, FFN))
    w.add_tensor("output_norm.weight", ones)
    w.add_tensor("output.weight", rand(n_vocab, HIDDEN))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    (out.parent / "corpus.txt").write_text("\n".join(paragraphs) + "\n")
    text = "\n".join(paragraphs)
    n = len(tok.encode(text).ids)
    print(f"{out}: vocab {n_vocab}, {len(merges)} merges, {out.stat().st_size} bytes; "
          f"corpus {len(text)} bytes, {len(text) / n:.2f} bytes per token")
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]).resolve()))
