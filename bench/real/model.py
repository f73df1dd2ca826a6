"""Writes the tiny local model that real vLLM serves in `make real`: nothing is downloaded.

    python model.py OUT_DIR

OUT_DIR gets what vLLM needs to serve a `LlamaForCausalLM` with `--load-format dummy`
(random weights, none on disk): `config.json`, `generation_config.json`, a byte-level BPE
`tokenizer.json` trained here with `tokenizers`, `tokenizer_config.json` with a ChatML chat
template that renders `tools`, assistant `tool_calls` and `tool` messages, and `corpus.txt`,
the English text the tokenizer was trained on and the workloads draw their prompts from.

The corpus is the docstrings of this interpreter's standard library: real English prose, so
the tokenizer's bytes per token (what the filter learns from the pods' usage reports) is that
of a BPE tokenizer on English, not of made-up words. The model is sized so that a prefill
costs real time on one CPU core (hidden 256, 4 layers: ~6 MFLOP a token) and the prefix
cache shows in the time to first token, while a replica still starts in about two minutes.
"""

from __future__ import annotations

import ast
import json
import sys
import sysconfig
from pathlib import Path

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

VOCAB = 4096
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TOOL_TOKENS = ["<tool_call>", "</tool_call>"]
# Standard-library modules whose docstrings make the corpus (fixed, so the corpus is the
# same on every machine with this Python version).
MODULES = [
    "argparse", "asyncio/base_events", "asyncio/streams", "collections/__init__", "configparser",
    "csv", "dataclasses", "datetime", "decimal", "difflib", "email/message", "enum", "fractions",
    "ftplib", "functools", "http/client", "http/server", "imaplib", "inspect", "ipaddress",
    "logging/__init__", "logging/handlers", "mailbox", "multiprocessing/pool", "optparse",
    "pathlib", "pickle", "pydoc", "random", "shutil", "smtplib", "socket", "statistics",
    "subprocess", "tarfile", "tempfile", "textwrap", "threading", "typing", "unittest/case",
    "urllib/request", "zipfile",
]

# ChatML, as Qwen and Hermes models use it: tools first (so a request's tools and then its
# messages make one growing prefix, as the filter hashes them), each message between
# <|im_start|>role and <|im_end|>, tool calls as <tool_call> JSON.
CHAT_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n# Tools\n<tools>"
    "{% for t in tools %}\n{{ t | tojson }}{% endfor %}\n</tools><|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m.role }}\n"
    "{% if m.content is string %}{{ m.content }}"
    "{% elif m.content %}{% for p in m.content %}{% if p.type == 'text' %}{{ p.text }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{% if m.tool_calls %}{% for tc in m.tool_calls %}\n<tool_call>"
    "{{ {'name': tc.function.name, 'arguments': tc.function.arguments} | tojson }}</tool_call>"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def corpus() -> list[str]:
    """Paragraphs of the standard library's docstrings, whitespace collapsed, in a fixed order."""
    lib = Path(sysconfig.get_paths()["stdlib"])
    out: list[str] = []
    for mod in MODULES:
        path = lib / f"{mod}.py"
        if not path.exists():
            continue
        tree = ast.parse(path.read_text(encoding="utf-8", errors="replace"))
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                for para in (doc or "").split("\n\n"):
                    text = " ".join(para.split())
                    if len(text) >= 40 and text.isascii():
                        out.append(text)
    return out


def train(paragraphs: list[str]) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(paragraphs, trainer=trainer)
    # vLLM's hermes tool-call parser (`--tool-call-parser hermes`) refuses a tokenizer
    # without these two tokens; as in Qwen's and Hermes' tokenizers they are not special,
    # so a detokenized answer keeps them.
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in TOOL_TOKENS])
    return tok


def main(out: Path) -> int:
    out.mkdir(parents=True, exist_ok=True)
    paragraphs = corpus()
    if len(paragraphs) < 2000:
        raise SystemExit(f"only {len(paragraphs)} docstring paragraphs found under the stdlib: too few")
    tok = train(paragraphs)
    tok.save(str(out / "tokenizer.json"))
    vocab = tok.get_vocab_size()
    ids = {s: tok.token_to_id(s) for s in SPECIAL}
    (out / "corpus.txt").write_text("\n".join(paragraphs) + "\n")
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "model_max_length": 4096,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }, indent=1))
    (out / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 256,
        "intermediate_size": 768,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "head_dim": 64,
        "num_hidden_layers": 4,
        "vocab_size": vocab,
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "bos_token_id": ids["<|endoftext|>"],
        "eos_token_id": ids["<|im_end|>"],
        "pad_token_id": ids["<|endoftext|>"],
    }, indent=1))
    (out / "generation_config.json").write_text(json.dumps({
        "eos_token_id": ids["<|im_end|>"], "pad_token_id": ids["<|endoftext|>"]}, indent=1))
    text = "\n".join(paragraphs)
    n = len(tok.encode(text).ids)
    print(f"{out}: vocab {vocab}, corpus {len(paragraphs)} paragraphs, {len(text)} bytes, "
          f"{len(text) / n:.2f} bytes per token")
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]).resolve()))
