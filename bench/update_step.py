"""One update step on a real (151,936-id) vocabulary: textgym's trainers against TRL 1.16's, side by side.

Everything before this bench was measured with textgym's 1,024-id vocabulary; a real policy
(Qwen2.5) has 151,936 ids, and there the [tokens, vocab] logits, not the weights, decide the
memory of an update. On a locally built `small-v152k` model (the `small` body, 512 hidden,
6 layers, tied embeddings, ~97 M parameters; `textgym.model_init.init_model`, random init,
float32 weights), each row below runs in its own fresh subprocess, textgym's trainer or TRL's,
on the same batch (token ids drawn once by the parent and saved for the children):

- GRPO: 8 sequences of one group (G = 8, one shared 128-token prompt + 896 response
  tokens each, no padding). The update step, identical on both sides: the reference's
  log-probs of the batch (no gradient) + the policy's log-probs with gradient + the loss
  (clipped surrogate with μ = 1, ε = 0.2, plus β·k3(π_θ‖π_ref) in the loss, β = 0.04,
  aggregated as a token mean over the whole batch) + backward + gradient clipping at 1.0 +
  one AdamW step (lr 1e-5). Old log-probs: with μ = 1 TRL takes the detached current
  log-probs inside its loss; textgym's update reads them from the batch, where a real run
  has them from sampling, so the bench fills `batch.old_logprobs` with textgym's own
  `updater.trainer_logprobs` pass before each step, outside the timed update (its time is printed
  apart). Advantages: one fixed group-normalised vector (mean 0), the same on both sides.
  textgym: `textgym.trainers.rl.grpo.GRPOTrainer(...).update(batch, advantages)` (it computes
  the reference log-probs itself, `kl_placement: loss`), config `loss_aggregation:
  token_mean`, `kl_estimator: k3`, `epochs: 1`, minibatch = the whole batch. TRL:
  `trl.GRPOTrainer` with `loss_type="dapo"` (its token mean over the whole generation batch),
  `beta=0.04`, `num_iterations=1`; the reference log-probs come from TRL's own
  `_get_per_token_logps_and_entropies` on its `ref_model` (as `_generate_and_score_completions`
  computes them, micro-batch by micro-batch) inside the timed step; then, per micro-batch,
  TRL's own `training_step` (its `compute_loss` → `_compute_loss`, `accelerator.backward`)
  on a prepared `inputs` dict (prompt/completion ids and masks, advantages,
  `num_items_in_batch`, `ref_per_token_logps`; TRL's generation half, `_prepare_inputs`, is
  bypassed), then its `_clip_grad_norm`, optimizer and scheduler step. To make the loss
  check below test the log-probs, both references are given the weights of a second random
  init (seed 1) after the trainers are built: the KL term is then non-zero, and with
  mean-zero advantages and a ratio of 1 it is the whole loss at step 1.
- SFT: 8 different sequences (128 prompt + 896 target tokens), token-mean NLL of the target
  tokens. textgym: `SFTTrainer.train_step()` with its task sampling and example building
  replaced by the prepared rows (`sampler.next`, `example`); TRL: `trl.SFTTrainer`'s
  `training_step` on batches from its own collator (labels −100 on the prompt, i.e.
  completion-only loss), then clip, optimizer and scheduler step.
- DPO: 4 pairs (one 128-token prompt, 896-token chosen and rejected responses: 8 sequences),
  sigmoid loss, β = 0.1. Both sides compute the reference log-probs once before training
  (textgym always caches them; TRL with `precompute_ref_log_probs=True`, which also drops
  its reference model), so the update is the policy's forward over chosen and rejected, the
  loss, backward, clip and AdamW. textgym: `PreferenceTrainer.train_step()`; TRL: its
  `training_step` on batches from its own collator (with the precomputed columns).

Micro-batches: 2 sequences per forward on both sides (GRPO: TRL's
`per_device_train_batch_size=2`, `gradient_accumulation_steps=4`; textgym's
`micro_batch_size: 2`; DPO: one pair, i.e. chosen + rejected, per forward). TRL's memory-saving
options that are on: its fused LM head (always on in 1.16: log-probs and entropy are computed
in vocabulary tiles and recomputed in backward, never the full logits) and gradient
checkpointing (TRL's default; `--gradient-checkpointing off` turns it off on both sides).
textgym gets `parallel.gradient_checkpointing` set the same way, and whatever its log-prob
path does at the time it runs (the bench calls the trainers, not a copy). Neither side uses
Liger kernels (deprecated in TRL 1.16; no Triton on CPU) or padding-free batches (none of
these rows has padding). The TRL optimizer is its default (`adamw_torch_fused`); textgym's is
`torch.optim.AdamW` (for-each off on CPU): both AdamW.

Memory: each child reports the peak resident memory of its updates, as `bench/lora.py` does:
the weights are copied into anonymous memory after loading (safetensors maps the file; its
pages count only once touched), VmHWM is reset just before each timed update (after the
models, the batch and textgym's old-log-prob pass), and the children run with
`MALLOC_MMAP_THRESHOLD_=65536 MALLOC_TRIM_THRESHOLD_=0` so that freed blocks go back to
the system and the peak follows the live bytes. "peak MB" is the highest VmHWM of the steps
minus the resident memory after `import torch, transformers` and the trainer's package (the
interpreter's share): weights, reference, gradients, AdamW state (allocated in step 1) and
the update's activations. Time: the median update of `--steps` steps (the first included:
AdamW's state is allocated there). Tokens/s counts every token of every row, prompt
included (GRPO and SFT: 8 × 1,024; DPO: 8 × 1,024 with the prompt counted for chosen and
rejected), the same count on both sides, even where textgym computes a group's prompt once.

`--precision bf16` passes textgym's `parallel.mixed_precision: bf16` and TRL's `bf16=True`
(fp32 master weights on both sides); the table prints the dtype the policy's first MLP
actually computed in, so a setting that has no effect on one CPU process shows.

    python bench/update_step.py [--preset small-v152k] [--steps 2] [--threads 2]
                                [--precision fp32|bf16] [--gradient-checkpointing on|off]
                                [--with-0.5b] [--quick] [--only grpo,sft,dpo] [--device cpu|cuda]

`--device cuda` trains both sides on the GPU (TRL: `use_cpu=False`); "peak MB" is then
`torch.cuda.max_memory_allocated` during the update (reset before it; nothing else is on the
GPU before the models), the update's time is taken between `torch.cuda.synchronize()` calls.

`--with-0.5b` adds a second table for `0.5b-v152k` (Qwen2.5-0.5B's shape; 1 step per row).
`--quick` is the development size (the `tiny` preset, 8 × (16 + 48) tokens; under 2 minutes).
Last two lines: `update peak memory ratio textgym/trl: X.XX` and
`update throughput ratio textgym/trl: X.XX` (the GRPO row of the first table).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TQDM_DISABLE", "1")

BETA_GRPO = 0.04
BETA_DPO = 0.1
LR = 1e-5
GROUP = 8


# --- measurement helpers (as bench/lora.py) ------------------------------------------------
def _status_mb(key: str) -> float:
    """A size from /proc/self/status in MB (VmRSS: resident now; VmHWM: peak since the last reset)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
    raise KeyError(key)


def _reset_peak() -> None:
    """Reset VmHWM to the current RSS (Linux >= 4.0: write 5 to /proc/self/clear_refs)."""
    Path("/proc/self/clear_refs").write_text("5")


def _to_anonymous(*models: Any) -> None:
    """Copy every parameter into anonymous memory (not pages of the mmap'd safetensors file)."""
    import torch

    with torch.no_grad():
        for m in models:
            for p in m.parameters():
                p.data = p.data.clone()


def _load_weights(model: Any, folder: str) -> None:
    """Copy the weights saved in `folder` into `model` in place (the bench's reference)."""
    import torch
    from safetensors.torch import load_file

    state = load_file(str(Path(folder) / "model.safetensors"))
    with torch.no_grad():
        for name, p in model.named_parameters():
            key = name if name in state else name.removeprefix("base_model.")
            if key in state:
                p.copy_(state[key])


class _DtypeProbe:
    """Records the dtype of the first decoder layer's MLP output: what the forward computed in."""

    def __init__(self, model: Any) -> None:
        self.dtype = "?"
        layers = model.get_decoder().layers
        layers[0].mlp.register_forward_hook(self._hook)

    def _hook(self, _module: Any, _args: Any, out: Any) -> None:
        self.dtype = str(out.dtype).removeprefix("torch.")


class _Meter:
    """Per-step timing and peak memory: RSS on CPU (VmHWM reset before each timed update), the CUDA
    allocator's peak on a GPU (`torch.cuda.max_memory_allocated`, reset before each update)."""

    def __init__(self, base_mb: float, device: str = "cpu") -> None:
        self.base_mb = base_mb
        self.cuda = device.startswith("cuda")
        self.times: list[float] = []
        self.peaks: list[float] = []
        self.losses: list[float] = []
        self._t0 = 0.0

    def start(self) -> None:
        if self.cuda:
            import torch

            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        else:
            _reset_peak()
        self._t0 = time.perf_counter()

    def stop(self, loss: float) -> None:
        if self.cuda:
            import torch

            torch.cuda.synchronize()
            self.times.append(time.perf_counter() - self._t0)
            self.peaks.append(torch.cuda.max_memory_allocated() / 2**20 - self.base_mb)
        else:
            self.times.append(time.perf_counter() - self._t0)
            self.peaks.append(_status_mb("VmHWM") - self.base_mb)
        self.losses.append(loss)

    def result(self, **extra: Any) -> dict[str, Any]:
        return {
            "peak_mb": max(self.peaks),
            "update_s": statistics.median(self.times),
            "times": self.times,
            "peaks": self.peaks,
            "losses": self.losses,
            **extra,
        }


# --- the children --------------------------------------------------------------------------
def _textgym_child(args: argparse.Namespace, data: dict[str, Any], base_mb: float) -> dict[str, Any]:
    import pyarrow as pa
    import torch

    from textgym.agents.trajectory import Trajectory
    from textgym.config import GRPOConfig, ParallelConfig, PreferenceConfig, SFTConfig
    from textgym.models import load_model
    from textgym.training.batch import RolloutBatch

    gc = args.gradient_checkpointing == "on"
    parallel = ParallelConfig(mixed_precision=args.precision, gradient_checkpointing=gc)
    P, L, mb = args.prompt_len, args.response_len, args.micro_batch
    env = {"id": "textgym/Arithmetic-v0"}
    optim = {"lr": LR, "max_grad_norm": 1.0}
    work = Path(args.work) / f"textgym-{args.row}"
    torch.manual_seed(0)
    policy, tok = load_model(args.model, device=args.device)
    _to_anonymous(policy)
    probe = _DtypeProbe(policy)
    meter = _Meter(base_mb, args.device)
    extra: dict[str, Any] = {}
    if args.row == "grpo":
        from textgym.trainers.rl.grpo import GRPOTrainer

        ids = data["grpo_ids"]
        B = ids.shape[0]
        cfg = GRPOConfig.model_validate(
            {
                "env": env,
                "steps": 1000,
                "prompts_per_step": B // GROUP,
                "group_size": GROUP,
                "sampling": {"temperature": 1.0, "max_new_tokens": L},
                "epochs": 1,
                "minibatch_size": B,
                "micro_batch_size": mb,
                "clip_low": 0.2,
                "clip_high": 0.2,
                "loss_aggregation": "token_mean",
                "kl_coef": BETA_GRPO,
                "kl_estimator": "k3",
                "kl_placement": "loss",
                "optim": optim,
            }
        )
        trainer = GRPOTrainer(cfg, policy, tok, work, parallel=parallel, log_with=())
        assert trainer.reference is not None
        _load_weights(trainer.reference, args.reference)
        batch = RolloutBatch(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            position_ids=torch.arange(P + L).expand(B, -1).contiguous(),
            prompt_width=P,
            loss_mask=torch.ones(B, L),
            old_logprobs=torch.zeros(B, L),
            token_rewards=torch.zeros(B, L),
            rewards=torch.zeros(B),
            groups=torch.arange(B) // GROUP,
        ).to(policy.device)
        adv = data["advantages"].to(policy.device)
        old_s, kls = [], []
        for _ in range(args.steps):
            t = time.perf_counter()
            batch.old_logprobs = trainer.updater.trainer_logprobs(batch)  # a real run has them from sampling
            old_s.append(time.perf_counter() - t)
            meter.start()
            m = trainer.update(batch, adv)
            meter.stop(m["loss/total"])
            kls.append(m.get("kl/ref", float("nan")))
        extra = {"old_logprobs_s": statistics.median(old_s), "kl": kls}
    elif args.row == "sft":
        from textgym.trainers.sft import SFTTrainer

        ids = data["sft_ids"]
        B = ids.shape[0]
        cfg = SFTConfig.model_validate(
            {"env": env, "steps": 1000, "batch_size": B, "micro_batch_size": mb, "optim": optim}
        )
        trainer = SFTTrainer(cfg, policy, tok, work, parallel=parallel, log_with=())
        mask = torch.cat([torch.zeros(P), torch.ones(L)])
        rows = [
            Trajectory(
                token_ids=ids[i],
                loss_mask=mask,
                logprobs=torch.zeros(P + L),
                token_rewards=torch.zeros(P + L),
                prompt_length=P,
                messages=[],
                reward=0.0,
            )
            for i in range(B)
        ]
        trainer.sampler.next = lambda n: list(range(n))  # type: ignore[method-assign]
        trainer.example = lambda i: rows[i]  # type: ignore[method-assign]
        for _ in range(args.steps):
            meter.start()
            m = trainer.train_step()
            meter.stop(m["loss/sft"])
    else:
        from textgym.trainers.preference.offline import PreferenceTrainer

        prompts, chosen, rejected = data["dpo_prompt"], data["dpo_chosen"], data["dpo_rejected"]
        n = prompts.shape[0]
        pairs = pa.table(
            {
                "prompt_ids": prompts.tolist(),
                "chosen_ids": chosen.tolist(),
                "chosen_mask": [[1] * L] * n,
                "rejected_ids": rejected.tolist(),
                "rejected_mask": [[1] * L] * n,
            }
        )
        cfg = PreferenceConfig.model_validate(
            {
                "env": env,
                "loss": "dpo",
                "beta": BETA_DPO,
                "batch_size": n,
                "micro_batch_size": max(1, mb // 2),
                "epochs": 1000,
                "optim": optim,
            }
        )
        trainer = PreferenceTrainer(cfg, policy, tok, work, pairs=pairs, parallel=parallel, log_with=())
        for _ in range(args.steps):
            meter.start()
            m = trainer.train_step()
            meter.stop(m["loss/dpo"])
    return meter.result(dtype=probe.dtype, **extra)


def _trl_child(args: argparse.Namespace, data: dict[str, Any], base_mb: float) -> dict[str, Any]:
    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer, PrinterCallback

    P, L, mb = args.prompt_len, args.response_len, args.micro_batch
    bf16 = args.precision == "bf16"
    gc = args.gradient_checkpointing == "on"
    common = {
        "output_dir": str(Path(args.work) / f"trl-{args.row}"),
        "learning_rate": LR,
        "lr_scheduler_type": "constant",
        "warmup_steps": 0,
        "max_grad_norm": 1.0,
        "max_steps": 1000,
        "logging_steps": 1000,
        "save_strategy": "no",
        "report_to": "none",
        "use_cpu": not args.device.startswith("cuda"),
        "bf16": bf16,
        "gradient_checkpointing": gc,
        "seed": 0,
        "dataloader_num_workers": 0,
        "disable_tqdm": True,
    }
    tok = AutoTokenizer.from_pretrained(args.model)
    torch.manual_seed(0)
    meter = _Meter(base_mb, args.device)
    extra: dict[str, Any] = {}
    if args.row == "grpo":
        from trl import GRPOConfig, GRPOTrainer
        from trl.models.utils import disable_gradient_checkpointing

        ids = data["grpo_ids"]
        B = ids.shape[0]
        cfg = GRPOConfig(
            **common,
            per_device_train_batch_size=mb,
            gradient_accumulation_steps=B // mb,
            num_generations=GROUP,
            max_completion_length=L,
            num_iterations=1,
            beta=BETA_GRPO,
            epsilon=0.2,
            loss_type="dapo",
            temperature=1.0,
            model_init_kwargs={"dtype": torch.float32},
        )
        trainer = GRPOTrainer(
            model=args.model,
            reward_funcs=lambda completions, **_: [0.0] * len(completions),
            args=cfg,
            train_dataset=Dataset.from_list([{"prompt": "x"}] * B),
            processing_class=tok,
        )
        model, ref = trainer.model, trainer.ref_model
        assert ref is not None
        _to_anonymous(model, ref)
        _load_weights(ref, args.reference)
    elif args.row == "sft":
        from trl import SFTConfig, SFTTrainer

        ids = data["sft_ids"]
        B = ids.shape[0]
        labels = ids.clone()
        labels[:, :P] = -100  # completion-only loss, as TRL's prompt-completion preprocessing does
        dataset = Dataset.from_dict({"input_ids": ids.tolist(), "labels": labels.tolist()})
        cfg = SFTConfig(
            **common,
            per_device_train_batch_size=mb,
            gradient_accumulation_steps=B // mb,
            max_length=None,
            model_init_kwargs={"dtype": torch.float32},
        )
        trainer = SFTTrainer(model=args.model, args=cfg, train_dataset=dataset, processing_class=tok)
        model = trainer.model
        _to_anonymous(model)
    else:
        from trl import DPOConfig, DPOTrainer

        prompts, chosen, rejected = data["dpo_prompt"], data["dpo_chosen"], data["dpo_rejected"]
        n = prompts.shape[0]
        dataset = Dataset.from_dict(
            {"prompt_ids": prompts.tolist(), "chosen_ids": chosen.tolist(), "rejected_ids": rejected.tolist()}
        )
        B = 2 * n
        # The rows are token ids already (what `_prepare_dataset` makes of text: prompt_ids,
        # chosen_ids, rejected_ids); ids past the local 1,024-id tokenizer have no text to start from.
        DPOTrainer._prepare_dataset = lambda self, dataset, *a, **k: dataset  # type: ignore[method-assign]
        cfg = DPOConfig(
            **common,
            per_device_train_batch_size=max(1, mb // 2),
            gradient_accumulation_steps=n // max(1, mb // 2),
            beta=BETA_DPO,
            loss_type=["sigmoid"],
            precompute_ref_log_probs=True,
            max_length=None,
            model_init_kwargs={"dtype": torch.float32},
        )
        trainer = DPOTrainer(model=args.model, args=cfg, train_dataset=dataset, processing_class=tok)
        model = trainer.model
        _to_anonymous(model)
    trainer.remove_callback(PrinterCallback)
    args_ = trainer.args
    if args_.gradient_checkpointing:  # what `Trainer.train` does before its loop
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=args_.gradient_checkpointing_kwargs)
    trainer.create_optimizer_and_scheduler(num_training_steps=args_.max_steps)
    GA = args_.gradient_accumulation_steps
    trainer.current_gradient_accumulation_steps = GA
    probe = _DtypeProbe(model)
    model.train()

    def optimizer_step() -> None:  # the end of `Trainer._inner_training_loop`'s sync step
        trainer._clip_grad_norm(model)
        trainer.optimizer.step()
        trainer.lr_scheduler.step()
        model.zero_grad()

    if args.row == "grpo":
        trainer._prepare_inputs = lambda inputs: inputs  # type: ignore[method-assign]  # no generation
        ids, advantages = ids.to(model.device), data["advantages"].to(model.device)
        prompt_ids, completion_ids = ids[:, :P], ids[:, P:]
        prompt_mask, completion_mask = torch.ones_like(prompt_ids), torch.ones_like(completion_ids)
        num_items = completion_mask.sum()
        kls = []
        for _ in range(args.steps):
            trainer._metrics["train"].clear()
            meter.start()
            # The reference log-probs as `_generate_and_score_completions` computes them.
            with torch.no_grad(), disable_gradient_checkpointing(model, args_.gradient_checkpointing_kwargs):
                ref_logps, _, _ = trainer._get_per_token_logps_and_entropies(
                    ref,
                    ids,
                    torch.ones_like(ids),
                    L,
                    batch_size=args_.per_device_train_batch_size,
                )
            total = 0.0
            for s in range(0, B, mb):
                inputs = {
                    "prompt_ids": prompt_ids[s : s + mb],
                    "prompt_mask": prompt_mask[s : s + mb],
                    "completion_ids": completion_ids[s : s + mb],
                    "completion_mask": completion_mask[s : s + mb],
                    "advantages": advantages[s : s + mb],
                    "num_items_in_batch": num_items,
                    "ref_per_token_logps": ref_logps[s : s + mb],
                }
                total += float(trainer.training_step(model, inputs, num_items))
            optimizer_step()
            meter.stop(total)
            kls.append(statistics.mean(trainer._metrics["train"]["kl"]))
        extra = {"kl": kls}
    else:
        rows = [trainer.train_dataset[i] for i in range(len(trainer.train_dataset))]
        per = args_.per_device_train_batch_size
        micro = [trainer.data_collator(rows[s : s + per]) for s in range(0, len(rows), per)]
        for _ in range(args.steps):
            meter.start()
            batches, num_items = trainer.get_batch_samples(iter(micro), len(micro), model.device)
            total = sum(float(trainer.training_step(model, b, num_items)) for b in batches)
            optimizer_step()
            meter.stop(total)
    return meter.result(dtype=probe.dtype, optim=args_.optim, **extra)


def child(args: argparse.Namespace) -> None:
    """Run one (row, side) in this process; print its figures as the last line (JSON)."""
    import torch
    import transformers  # noqa: F401  (its import is part of the baseline, not of the update)

    # Everything the trainers import counts in the baseline, not in the update's memory.
    if args.side == "trl":
        import datasets  # noqa: F401
        from transformers.utils import logging as hf_logging
        from trl import DPOTrainer, GRPOTrainer, SFTTrainer  # noqa: F401
        from trl.models.utils import disable_gradient_checkpointing  # noqa: F401

        hf_logging.set_verbosity_error()
    else:
        import pyarrow  # noqa: F401

        import textgym.trainers.preference.offline
        import textgym.trainers.rl.grpo
        import textgym.trainers.sft  # noqa: F401
    torch.set_num_threads(args.threads)
    # On a GPU nothing is allocated yet: the peak counts weights, gradients, AdamW and activations.
    base_mb = 0.0 if args.device.startswith("cuda") else _status_mb("VmRSS")
    data = torch.load(args.data)
    run = _trl_child if args.side == "trl" else _textgym_child
    out = run(args, data, base_mb)
    print(json.dumps({"row": args.row, "side": args.side, **out}))


# --- the parent ----------------------------------------------------------------------------
def make_data(path: Path, rows: int, P: int, L: int, vocab: int, low: int) -> None:
    """The batches every child trains on: token ids in [low, vocab), advantages of mean 0."""
    import torch

    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(low, vocab, (1, P), generator=g).expand(rows, P)  # one group, one prompt
    grpo = torch.cat([prompt, torch.randint(low, vocab, (rows, L), generator=g)], dim=1)
    rewards = torch.rand(rows, generator=g)
    advantages = (rewards - rewards.mean()) / (rewards.std() + 1e-4)
    sft = torch.randint(low, vocab, (rows, P + L), generator=g)
    pairs = rows // 2
    torch.save(
        {
            "grpo_ids": grpo.contiguous(),
            "advantages": advantages,
            "sft_ids": sft,
            "dpo_prompt": torch.randint(low, vocab, (pairs, P), generator=g),
            "dpo_chosen": torch.randint(low, vocab, (pairs, L), generator=g),
            "dpo_rejected": torch.randint(low, vocab, (pairs, L), generator=g),
        },
        path,
    )


def run_table(args: argparse.Namespace, preset: str, steps: int, work: Path) -> dict[tuple[str, str], dict]:
    """Build the preset's models and batch, run every (row, side) child, print the table."""
    from transformers import AutoTokenizer

    from textgym.model_init import init_model

    t0 = time.perf_counter()
    model = init_model(preset, work / preset)
    reference = init_model(preset, work / f"{preset}-ref", seed=1)
    tok = AutoTokenizer.from_pretrained(model)
    vocab = json.loads((model / "config.json").read_text())["vocab_size"]
    low = max(tok.all_special_ids) + 1
    data = work / f"{preset}-data.pt"
    make_data(data, args.rows, args.prompt_len, args.response_len, vocab, low)
    print(
        f"\n{preset} ({vocab:,}-id vocabulary): {args.rows} sequences x ({args.prompt_len} + "
        f"{args.response_len}) tokens, {args.micro_batch} rows per forward, {steps} step(s) per row, "
        f"{args.precision}, gradient checkpointing {args.gradient_checkpointing} (both sides), "
        f"threads {args.threads}, {args.device} (models built in {time.perf_counter() - t0:.0f} s)",
        flush=True,
    )
    env = dict(os.environ)
    if args.malloc == "mmap":
        env.update(MALLOC_MMAP_THRESHOLD_="65536", MALLOC_TRIM_THRESHOLD_="0")
    results: dict[tuple[str, str], dict] = {}
    for row in args.row_list:
        for side in ("textgym", "trl"):
            cmd = [sys.executable, __file__, "--side", side, "--row", row, "--model", str(model)]
            cmd += ["--reference", str(reference), "--data", str(data), "--work", str(work)]
            cmd += ["--steps", str(steps), "--threads", str(args.threads), "--precision", args.precision]
            cmd += ["--gradient-checkpointing", args.gradient_checkpointing, "--device", args.device]
            for k in ("prompt_len", "response_len", "micro_batch"):
                cmd += [f"--{k.replace('_', '-')}", str(getattr(args, k))]
            t = time.perf_counter()
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
            if proc.returncode != 0:
                sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-8000:])
                raise SystemExit(f"{row}/{side} failed (exit {proc.returncode})")
            r = json.loads(proc.stdout.strip().splitlines()[-1])
            results[(row, side)] = r
            losses = ", ".join(f"{v:.6g}" for v in r["losses"])
            print(
                f"  {row:4} {side:7} done in {time.perf_counter() - t:5.0f} s: update s "
                f"{', '.join(f'{x:.2f}' for x in r['times'])}; peak MB "
                f"{', '.join(f'{x:.0f}' for x in r['peaks'])}; loss {losses}",
                flush=True,
            )
    tokens = {"grpo": args.rows, "sft": args.rows, "dpo": 2 * (args.rows // 2)}
    print(f"{'row':5} {'side':8} {'peak MB':>9} {'update s':>9} {'tokens/s':>9} {'dtype':>9}  loss at step 1")
    for (row, side), r in results.items():
        r["tokens_s"] = tokens[row] * (args.prompt_len + args.response_len) / r["update_s"]
        print(
            f"{row.upper():5} {side:8} {r['peak_mb']:>9.0f} {r['update_s']:>9.2f} {r['tokens_s']:>9.0f} "
            f"{r['dtype']:>9}  {r['losses'][0]:.7g}"
        )
    for row in args.row_list:
        a, b = results[(row, "textgym")], results[(row, "trl")]
        la, lb = a["losses"][0], b["losses"][0]
        rel = abs(la - lb) / max(abs(lb), 1e-12)
        note = ""
        if row == "grpo":
            note = (
                f"; mean k3 KL at step 1 textgym {a['kl'][0]:.6g}, trl {b['kl'][0]:.6g}; "
                f"textgym's old-log-prob pass (outside the update) {a['old_logprobs_s']:.2f} s"
            )
        if row == "dpo":
            note = " (the reference is the start policy: log 2 at step 1 on both sides)"
        print(
            f"  {row.upper()} step-1 loss textgym {la:.7g} vs trl {lb:.7g}: relative difference {rel:.1e}",
            end="",
        )
        print(note)
    print(f"  TRL optimizer: {results[(args.row_list[0], 'trl')]['optim']}; textgym: torch.optim.AdamW")
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="small-v152k")
    ap.add_argument("--rows", type=int, default=8, help="sequences per batch (GRPO: one group of 8)")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--response-len", type=int, default=896)
    ap.add_argument("--micro-batch", type=int, default=2, help="sequences per forward, both sides")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    ap.add_argument("--gradient-checkpointing", choices=["on", "off"], default="on")
    ap.add_argument("--with-0.5b", dest="with_05b", action="store_true", help="add the 0.5b-v152k table")
    ap.add_argument("--quick", action="store_true", help="tiny preset, 8 x (16 + 48) tokens")
    ap.add_argument("--only", dest="rows_to_run", default="grpo,sft,dpo")
    ap.add_argument("--malloc", choices=["mmap", "default"], default="mmap")
    ap.add_argument("--device", default="cpu", help="cpu, or cuda: both sides train on the GPU")
    ap.add_argument("--side", choices=["textgym", "trl"], help=argparse.SUPPRESS)
    ap.add_argument("--row", choices=["grpo", "sft", "dpo"], help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--reference", help=argparse.SUPPRESS)
    ap.add_argument("--data", help=argparse.SUPPRESS)
    ap.add_argument("--work", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.side is not None:
        child(args)
        return
    if args.quick:
        args.preset, args.prompt_len, args.response_len = "tiny", 16, 48
    if args.rows % GROUP or args.rows % args.micro_batch or args.micro_batch % 2:
        raise SystemExit("--rows must be a multiple of 8 and of --micro-batch, which must be even")
    args.row_list = [r.strip() for r in args.rows_to_run.split(",") if r.strip()]
    t0 = time.perf_counter()
    import torch
    import transformers
    import trl

    import textgym

    print(
        f"textgym {textgym.__version__} · trl {trl.__version__} · transformers {transformers.__version__} "
        f"· torch {torch.__version__} · malloc {args.malloc}"
    )
    with tempfile.TemporaryDirectory(prefix="update_step_") as d:
        work = Path(d)
        first = run_table(args, args.preset, args.steps, work)
        if args.with_05b:
            run_table(args, "0.5b-v152k", 1, work)
    print(f"total wall time {time.perf_counter() - t0:.0f} s")
    if ("grpo", "textgym") in first:
        a, b = first[("grpo", "textgym")], first[("grpo", "trl")]
        print(f"update peak memory ratio textgym/trl: {a['peak_mb'] / b['peak_mb']:.2f}")
        print(f"update throughput ratio textgym/trl: {a['tokens_s'] / b['tokens_s']:.2f}")


if __name__ == "__main__":
    main()
