"""Load any local Hugging Face causal LM folder; the chat template and model sizes textgym builds.

Models are built locally by `textgym.model_init.init_model` (no hub downloads): a tokenizer
with the ChatML special tokens and `CHAT_TEMPLATE`, and a Qwen2 of a `PRESETS` size.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

PAD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"

# Qwen2.5-style ChatML template. Text is emitted only through {{ ... }} expressions, so the
# whitespace control of the {%- ... %} tags cannot eat the newlines ChatML needs. Tool schemas
# passed as `apply_chat_template(..., tools=...)` are rendered into a system block.
CHAT_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n\\nYou may call one or more functions. Function signatures:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}"
    '{{- \'\\n</tools>\\n\\nFor each call return <tool_call>{"name": <function-name>, '
    '"arguments": <args-json-object>}</tool_call><|im_end|>\\n\' }}'
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if not (tools and loop.first and message['role'] == 'system') %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


# Qwen2's pre-tokenization: contractions, letter runs, single digits, punctuation runs, whitespace.


@dataclass(frozen=True)
class ModelPreset:
    """Architecture hyper-parameters of a Qwen2-style decoder (sizes in units, not bytes)."""

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    max_position_embeddings: int = 1024
    vocab_size: int | None = None
    """Rows of the embedding and the LM head; None: the tokenizer's size. A preset with a real
    model's vocabulary (151,936 for Qwen2.5) keeps textgym's local tokenizer, whose ids are the
    first ones: the rest exist, cost memory and compute like a real model's, and are never
    produced by the tokenizer (a random-init policy can still sample them; they decode to "")."""


PRESETS: dict[str, ModelPreset] = {
    # ~1.8 M parameters (with the 1024-id BPE): learns 2-digit arithmetic in minutes on 2 CPU cores.
    # Its window (2,048 positions; rotary, so no parameters) holds a tool env's schemas and turns.
    "tiny": ModelPreset(192, 4, 6, 2, 512, 2048),
    # ~20 M parameters: for GSM8K-format smoke runs and throughput benchmarks.
    "small": ModelPreset(512, 6, 8, 4, 1536, 2048),
    # ~0.5 B parameters with the Qwen2.5-0.5B shape (with this byte vocabulary): GPU benchmarks.
    "0.5b": ModelPreset(896, 24, 14, 2, 4864, 4096),
    # The same bodies with Qwen2.5's 151,936-id vocabulary: where the logits, not the weights,
    # decide memory (~97 M and ~494 M parameters, tied embeddings). For benchmarks.
    "small-v152k": ModelPreset(512, 6, 8, 4, 1536, 2048, vocab_size=151_936),
    "0.5b-v152k": ModelPreset(896, 24, 14, 2, 4864, 4096, vocab_size=151_936),
}


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerBase:
    """Load the tokenizer of a local model folder (pad token defaults to EOS).

    Raises:
        FileNotFoundError: if `path` is not a folder holding a `config.json`.
        ValueError: if the tokenizer has no chat template or no EOS token.
    """
    folder = Path(path)
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(
            f"model folder {str(folder)!r} not found or has no config.json; build one with "
            "`textgym model init --preset tiny --out DIR` or point to a local Hugging Face folder"
        )
    tok = AutoTokenizer.from_pretrained(folder)
    if tok.chat_template is None:
        raise ValueError(f"tokenizer in {folder} has no chat_template; textgym renders prompts with it")
    if tok.eos_token_id is None:
        raise ValueError(f"tokenizer in {folder} has no eos_token")
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok  # type: ignore[no-any-return]


def load_model(
    path: str | Path, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a local Hugging Face causal LM folder and its tokenizer.

    Raises:
        FileNotFoundError: if `path` is not a folder holding a `config.json`.
        ValueError: if the tokenizer has no chat template or no EOS token.
    """
    folder = Path(path)
    tok = load_tokenizer(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype)
    return model.to(device), tok  # type: ignore[arg-type]


def count_parameters(model: torch.nn.Module) -> int:
    """Return the number of parameters (tied weights counted once)."""
    return sum(p.numel() for p in model.parameters())


def disable_dropout(model: torch.nn.Module) -> int:
    """Set every dropout probability inside `model` to 0, in place; return how many were > 0.

    RL and preference losses compare the same weights' probabilities across two forward
    passes: π_old (or π_ref) in eval mode, π in training mode. Dropout makes the second a
    random function of the first, so the ratio π/π_old is not 1 at the first minibatch and
    the critic's values are noisy (as TRL's `disable_dropout_in_model` argues). This zeroes
    `p` of every `torch.nn.Dropout`-family module (GPT-2/OPT/Phi `*_pdrop` layers, peft's
    `lora_dropout`) and every float attribute named like `*dropout*` on a module (the
    `attention_dropout` that Llama/Qwen2 attention hands to SDPA). The model's `config` is
    left as it was loaded, so a saved checkpoint keeps the user's dropout settings.

    Args:
        model: any torch module (a causal LM, a critic, a peft model).

    Returns:
        The number of dropout probabilities that were above 0.
    """
    changed = 0
    for module in model.modules():
        if isinstance(module, torch.nn.modules.dropout._DropoutNd):
            changed += module.p > 0
            module.p = 0.0
            continue
        for name, value in list(vars(module).items()):
            if "dropout" in name and isinstance(value, float) and not isinstance(value, bool):
                changed += value > 0
                setattr(module, name, 0.0)
    return int(changed)
