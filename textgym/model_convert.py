"""Convert a GGUF causal LM into a plain Hugging Face folder (safetensors, tokenizer, chat template).

transformers reads GGUF files (with the `gguf` package installed) and dequantises their weights
to float32, but a model loaded that way carries its GGUF quantization config and refuses
`save_pretrained`. `convert_gguf` loads the file dense, drops that config, saves the weights in
float32 safetensors beside the tokenizer (with the file's chat template), then reloads the saved
folder and checks that it computes the same logits, bit for bit, as the model read from the GGUF
file. The folder loads with plain `AutoModelForCausalLM.from_pretrained(folder)`, without `gguf`.

The weights are the GGUF file's quantised values, dequantised: a Q4_1 file gives a float32
model whose weights take 2^4 distinct values per block of 32, not the original checkpoint's.
"""

from __future__ import annotations

import inspect
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

PROBE_TEXTS = (
    "<|im_start|>user\nWhat is 12 + 30?<|im_end|>\n<|im_start|>assistant\n",
    "The quick brown fox jumps over the lazy dog.",
)
"""Texts whose logits the converter compares between the GGUF-loaded model and the saved folder."""


@dataclass
class ConversionReport:
    """What `convert_gguf` did.

    Attributes:
        out_dir: the folder written.
        architecture: the model class (e.g. "LlamaForCausalLM").
        parameters: parameter count (tied weights counted once).
        max_abs_logit_diff: largest |logit difference| between the GGUF-loaded model and the saved
            folder on the first of `PROBE_TEXTS` (0.0: identical; not checked without `verify`).
        seconds: wall time of each step ("tokenizer", "weights", "save", "verify"), in seconds.
    """

    out_dir: Path
    architecture: str
    parameters: int
    max_abs_logit_diff: float
    seconds: dict[str, float]


def _dense_gguf_kwargs(gguf_file: str) -> dict[str, Any]:
    """`from_pretrained` kwargs that read `gguf_file` into plain dense float32 modules.

    transformers ≥ 5.19 can keep GGUF blocks packed (when its `kernels` package is installed);
    `GgufConfig(dequantize=True)` asks for plain modules. Older versions always dequantise.
    """
    kwargs: dict[str, Any] = {"gguf_file": gguf_file, "dtype": torch.float32}
    try:
        from transformers import GgufConfig  # type: ignore[attr-defined]
    except ImportError:
        return kwargs
    if "dequantize" in inspect.signature(GgufConfig.__init__).parameters:
        kwargs["quantization_config"] = GgufConfig(dequantize=True)
    return kwargs


def _drop_quantization(model: Any) -> None:
    """Forget the GGUF quantizer and its config (the weights are already dense), so the model saves."""
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None:
        quantizer.remove_quantization_config(model)
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    for name, p in model.named_parameters():
        if not p.dtype.is_floating_point:
            raise ValueError(f"{name} is still packed ({p.dtype}) after dequantising; cannot save it dense")


@torch.no_grad()
def probe_logits(model: Any, tokenizer: Any, texts: tuple[str, ...] = PROBE_TEXTS) -> list[torch.Tensor]:
    """The model's float32 logits `[1, T, vocab]` for each text, tokenized without special tokens added."""
    model.eval()
    out = []
    for text in texts:
        ids = tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
        out.append(model(input_ids=ids).logits.float())
    return out


def convert_gguf(
    gguf_path: str | Path,
    out_dir: str | Path,
    *,
    verify: bool = True,
    step: Callable[[str], None] | None = None,
) -> ConversionReport:
    """Convert one GGUF file into a Hugging Face causal-LM folder at `out_dir`.

    Writes `config.json` (no quantization config), `model.safetensors` (float32),
    `generation_config.json` (the file's BOS/EOS/pad ids only: no sampling defaults),
    `tokenizer.json`, `tokenizer_config.json` and `chat_template.jinja`. The tokenizer's
    `model_max_length` is set to the model's context (`max_position_embeddings`) and it pads on
    the left, as textgym's own tokenizers do.

    Args:
        gguf_path: the `.gguf` file (a llama.cpp model transformers can read, e.g. Llama, Qwen2).
        out_dir: the folder to write (created; existing files of the same names are replaced).
        verify: reload the saved folder and compare its logits on the first of `PROBE_TEXTS`
            with the GGUF-loaded model's; they must be equal (same float32 weights, same code).
        step: called with the name of each step as it starts ("tokenizer", "weights", "save",
            "verify"), e.g. to drive a progress display.

    Returns:
        A `ConversionReport`.

    Raises:
        ImportError: when the `gguf` package is missing (`pip install gguf`).
        FileNotFoundError: when `gguf_path` is not a file.
        ValueError: when the weights stay packed, or the saved folder's logits differ from the
            GGUF-loaded model's (`verify`).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = Path(gguf_path)
    if not gguf.is_file():
        raise FileNotFoundError(f"GGUF file {str(gguf)!r} not found")
    try:
        import gguf as _gguf  # noqa: F401  (transformers needs it to read the file)
    except ImportError as e:
        raise ImportError("reading a GGUF file needs the `gguf` package: pip install gguf") from e
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    seconds: dict[str, float] = {}

    def begin(name: str) -> float:
        if step is not None:
            step(name)
        return time.perf_counter()

    t = begin("tokenizer")
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    seconds["tokenizer"] = time.perf_counter() - t
    t = begin("weights")
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, **_dense_gguf_kwargs(gguf.name))
    _drop_quantization(model)
    seconds["weights"] = time.perf_counter() - t

    t = begin("save")
    n_ctx = getattr(model.config, "max_position_embeddings", None)
    if isinstance(n_ctx, int) and n_ctx > 0:
        tok.model_max_length = n_ctx
    tok.padding_side = "left"
    model.generation_config = _ids_only(model)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    _strip_loader_keys(out / "tokenizer_config.json")
    seconds["save"] = time.perf_counter() - t

    diff = 0.0
    if verify:
        t = begin("verify")
        saved = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
        saved_tok = AutoTokenizer.from_pretrained(out)
        probe = PROBE_TEXTS[:1]  # one short text: a forward pass of a 135M model costs seconds here
        for a, b in zip(probe_logits(model, tok, probe), probe_logits(saved, saved_tok, probe), strict=True):
            if a.shape != b.shape:
                raise ValueError(
                    f"the saved tokenizer splits a probe text differently: {a.shape} vs {b.shape}"
                )
            diff = max(diff, float((a - b).abs().max()))
        if diff != 0.0:
            raise ValueError(f"the saved folder's logits differ from the GGUF model's by up to {diff:.3g}")
        seconds["verify"] = time.perf_counter() - t
    return ConversionReport(
        out_dir=out,
        architecture=type(model).__name__,
        parameters=sum(p.numel() for p in model.parameters()),
        max_abs_logit_diff=diff,
        seconds=seconds,
    )


def _ids_only(model: Any) -> Any:
    """A generation config holding only the model's BOS/EOS/pad ids (no sampling defaults)."""
    from transformers import GenerationConfig

    ids = {}
    for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
        value = getattr(model.generation_config, name, None)
        ids[name] = value if value is not None else getattr(model.config, name, None)
    return GenerationConfig(**{k: v for k, v in ids.items() if v is not None})


def _strip_loader_keys(path: Path) -> None:
    """Drop the keys transformers writes about how the tokenizer was loaded (`is_local`, ...)."""
    if not path.is_file():
        return
    cfg = json.loads(path.read_text(encoding="utf-8"))
    for key in ("is_local", "local_files_only", "gguf_file"):
        cfg.pop(key, None)
    path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
