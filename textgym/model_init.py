"""Build small causal LMs locally (no hub downloads): a tokenizer and a Qwen2 model of a named size.

Two tokenizers are defined here, both lossless for any unicode text (every byte has
a token), both with the ChatML special tokens and a Qwen2-style chat template:

- `build_tokenizer("bpe")` (default): byte-level BPE trained in about 2 s on the text
  shipped with the package (GSM8K, MATH-500, chat-formatted arithmetic, read through the
  envs' task sets), Qwen2-style pre-tokenization with every digit its own token; 1024 ids.
- `build_tokenizer("byte")`: one token per UTF-8 byte, no merges; 259 ids.

`init_model` pairs one with a Qwen2 architecture of a `textgym.models.PRESETS` size and saves
a normal HF folder that `textgym.models.load_model` (or `from_pretrained`) loads. Loading lives
in `textgym.models`, which does not import the envs.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast, Qwen2Config

from textgym.models import CHAT_TEMPLATE, IM_END, IM_START, PAD_TOKEN, PRESETS


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte → printable-unicode map, as the `ByteLevel` pre-tokenizer uses."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    bs += list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs, strict=True)}


_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _tokenizer_corpus() -> Iterator[str]:
    """Text the BPE merges are learned from: the package's datasets and chat-formatted prompts."""
    from textgym.envs.arithmetic import ArithmeticTasks
    from textgym.envs.math_qa import gsm8k_tasks, math500_tasks

    def chat(user: str, assistant: str) -> str:
        return f"{IM_START}user\n{user}{IM_END}\n{IM_START}assistant\n{assistant}{IM_END}\n"

    for t in gsm8k_tasks("train"):
        yield chat(t.prompt, t.solution or "")
    for t in math500_tasks():
        yield chat(t.prompt, t.solution or "")
    arithmetic = ArithmeticTasks("train", operators="+-*/", digits=3, n_terms=3, n_test=1)
    for i in range(2000):
        t = arithmetic[i]
        yield chat(t.prompt, f"The answer is {t.solution}. <answer>{t.answer}</answer>")


def build_tokenizer(kind: str = "bpe", vocab_size: int = 1024) -> PreTrainedTokenizerFast:
    """Return a lossless tokenizer with ChatML special tokens and a chat template.

    Args:
        kind: "bpe" (trained byte-level BPE, digits split one per token) or "byte"
            (token id *b* is UTF-8 byte *b*).
        vocab_size: total ids of the "bpe" tokenizer (≥ 259: 256 bytes + 3 specials).

    Special tokens: `<|endoftext|>` (padding), `<|im_start|>`, `<|im_end|>` (end of turn, the EOS).

    Raises:
        ValueError: on an unknown kind or a vocab_size below 259.
    """
    byte_map = _bytes_to_unicode()
    specials = [PAD_TOKEN, IM_START, IM_END]
    if kind == "byte":
        vocab = {byte_map[b]: b for b in range(256)}
        tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        tok.add_special_tokens(specials)
    elif kind == "bpe":
        if vocab_size < 259:
            raise ValueError(f"vocab_size must be >= 259, got {vocab_size}")
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(_SPLIT_PATTERN), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=specials,
            initial_alphabet=[byte_map[b] for b in range(256)],
            show_progress=False,
        )
        tok.train_from_iterator(_tokenizer_corpus(), trainer)
    else:
        raise ValueError(f"tokenizer kind must be 'bpe' or 'byte', got {kind!r}")
    tok.decoder = decoders.ByteLevel()
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=IM_END,
        pad_token=PAD_TOKEN,
        padding_side="left",
        model_max_length=4096,
    )
    hf.chat_template = CHAT_TEMPLATE
    return hf


def init_model(preset: str, out_dir: str | Path, seed: int = 0, tokenizer: str = "bpe") -> Path:
    """Build a randomly initialised Qwen2 causal LM of `preset` size and save it with its tokenizer.

    Args:
        preset: a key of `PRESETS` ("tiny", "small", "0.5b", "small-v152k", "0.5b-v152k").
        out_dir: folder to write (`config.json`, `model.safetensors`, tokenizer files).
        seed: torch seed for the initial weights.
        tokenizer: "bpe" or "byte" (see `build_tokenizer`).

    Returns:
        The output folder.

    Raises:
        ValueError: if `preset` or `tokenizer` is not a known name.
    """
    if preset not in PRESETS:
        raise ValueError(f"unknown model preset {preset!r}; choose one of {sorted(PRESETS)}")
    p = PRESETS[preset]
    tok = build_tokenizer(tokenizer)
    config = Qwen2Config(
        vocab_size=max(len(tok), p.vocab_size or 0),
        hidden_size=p.hidden_size,
        num_hidden_layers=p.num_hidden_layers,
        num_attention_heads=p.num_attention_heads,
        num_key_value_heads=p.num_key_value_heads,
        intermediate_size=p.intermediate_size,
        max_position_embeddings=p.max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out
