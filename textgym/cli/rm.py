"""`textgym rm train`: a Bradley–Terry reward model from flags, or from a run config's `reward_model:` stage.

The flags and the YAML share one set of defaults, the schemas' (`RewardModelConfig`,
`ParallelConfig`, `RunConfig.device`): a flag left out leaves the config's value (or the
schema's default) alone, and a flag given overrides the config and its `key=value` overrides.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from textgym.cli._common import console, fail, leave_world
from textgym.config import ParallelConfig, RewardModelConfig, RunConfig

rm_app = typer.Typer(help="Reward models (Bradley-Terry) trained on preference pairs.", no_args_is_help=True)

_RM, _PAR = RewardModelConfig(), ParallelConfig()


def _opt(default: Any, help: str = "", **kw: Any) -> Any:
    """A flag whose value is None unless given; its help shows the schema's `default`."""
    shown = "" if default is None else f" \\[default: {default}]"  # escaped: not rich markup
    return typer.Option(help=f"{help}{shown}".strip(), show_default=False, **kw)


Config = Annotated[
    Path | None, typer.Argument(help="YAML run config with a reward_model stage (optional: flags suffice).")
]
Overrides = Annotated[list[str] | None, typer.Argument(help="Overrides such as reward_model.epochs=4.")]
Pairs = Annotated[Path | None, typer.Option(help="pairs.parquet (textgym pairs build), or its folder.")]
Model = Annotated[
    str | None,
    typer.Option(
        help="Causal LM to initialise the reward model from: a folder, a packaged model name or a Hub id."
    ),
]
Out = Annotated[Path | None, typer.Option(help="Output folder of the reward model.")]
Epochs = Annotated[int | None, _opt(_RM.epochs, min=1)]
BatchSize = Annotated[int | None, _opt(_RM.batch_size, "Pairs per step (over all ranks).", min=1)]
MicroBatch = Annotated[
    int | None, _opt(None, "Pairs per forward pass on each rank (gradient accumulation).", min=1)
]
MicroBatchTokens = Annotated[
    int | None,
    _opt(None, "Tokens per forward pass instead of a pair count (one process).", min=1),
]
Packing = Annotated[
    bool | None, _opt(_RM.packing, "Run each micro-batch as one padding-free packed sequence.")
]
Lr = Annotated[float | None, _opt(_RM.optim.lr, min=0.0)]
Schedule = Annotated[str | None, _opt(_RM.optim.schedule, "LR schedule: constant, cosine, linear.")]
EvalFraction = Annotated[
    float | None, _opt(_RM.eval_fraction, "Share of prompts held out.", min=0.0, max=0.9)
]
LmCoef = Annotated[
    float | None, _opt(_RM.lm_coef, "Weight of the LM loss on chosen responses (GRM regulariser).", min=0.0)
]
Seed = Annotated[int | None, _opt(_RM.seed)]
Device = Annotated[
    str | None, _opt(RunConfig.model_fields["device"].default, "auto (cuda when available), cpu or cuda.")
]
MixedPrecision = Annotated[
    str | None,
    _opt(_PAR.mixed_precision, "auto (bf16 on CUDA), bf16 or fp32 compute, on one device or under torchrun."),
]
GradientCheckpointing = Annotated[
    bool | None,
    _opt(_PAR.gradient_checkpointing, "Recompute each block's activations in backward (less memory)."),
]
CheckpointEvery = Annotated[
    int | None,
    _opt(
        _RM.checkpoint_every, "Save a checkpoint to OUT/checkpoints every this many steps (0: none).", min=0
    ),
]
KeepCheckpoints = Annotated[int | None, _opt(_RM.keep_checkpoints, "How many checkpoints to keep.", min=1)]
Resume = Annotated[
    bool,
    typer.Option(help="Continue from the newest checkpoint in OUT (else OUT's old checkpoints are removed)."),
]

_FLAG_KEYS = {
    "pairs": "reward_model.pairs", "model": "reward_model.model", "out": "reward_model.out",
    "epochs": "reward_model.epochs", "batch_size": "reward_model.batch_size",
    "micro_batch_size": "reward_model.micro_batch_size",
    "micro_batch_tokens": "reward_model.micro_batch_tokens", "packing": "reward_model.packing",
    "lr": "reward_model.optim.lr",
    "schedule": "reward_model.optim.schedule", "eval_fraction": "reward_model.eval_fraction",
    "lm_coef": "reward_model.lm_coef", "seed": "reward_model.seed", "device": "device",
    "mixed_precision": "parallel.mixed_precision",
    "gradient_checkpointing": "parallel.gradient_checkpointing",
    "checkpoint_every": "reward_model.checkpoint_every", "keep_checkpoints": "reward_model.keep_checkpoints",
}  # fmt: skip
"""Each flag's dotted key in the run config."""


@rm_app.command("train")
def rm_train_cmd(
    config: Config = None,
    overrides: Overrides = None,
    pairs: Pairs = None,
    model: Model = None,
    out: Out = None,
    epochs: Epochs = None,
    batch_size: BatchSize = None,
    micro_batch_size: MicroBatch = None,
    micro_batch_tokens: MicroBatchTokens = None,
    packing: Packing = None,
    lr: Lr = None,
    schedule: Schedule = None,
    eval_fraction: EvalFraction = None,
    lm_coef: LmCoef = None,
    seed: Seed = None,
    device: Device = None,
    mixed_precision: MixedPrecision = None,
    gradient_checkpointing: GradientCheckpointing = None,
    checkpoint_every: CheckpointEvery = None,
    keep_checkpoints: KeepCheckpoints = None,
    resume: Resume = False,
) -> None:
    """Train a Bradley-Terry reward model; print its held-out pairwise accuracy.

    From flags alone (--pairs, --model and --out are then required), or from CONFIG's
    `reward_model:` stage with `key=value` overrides (flags given win over both).

    Under `torchrun --nproc-per-node N -m textgym rm train ...` it trains sharded on N ranks.
    """
    from textgym.pipeline import run_reward_model

    flags = {k: v for k, v in locals().items() if k in _FLAG_KEYS and v is not None}  # the flags given
    if mixed_precision is not None and mixed_precision not in ("auto", "bf16", "fp32"):
        fail(f"--mixed-precision must be auto, bf16 or fp32, got {mixed_precision!r}")
    try:
        cfg = _load(config, overrides or [], flags)
        res = run_reward_model(cfg, resume=resume, echo=console.print)
    except (FileNotFoundError, ValueError, OSError) as e:
        leave_world(error=e)
    if not leave_world():
        return
    console.print(
        f"reward model in {res['out']}: held-out pairwise accuracy {res['heldout_accuracy']:.3f} "
        f"(before training {res['heldout_accuracy_before']:.3f}) on {res['heldout_pairs']} pairs; "
        f"{res['train_pairs']} training pairs, {res['wall_time_s']:.0f}s"
    )


def _load(config: Path | None, overrides: list[str], flags: dict[str, Any]) -> RunConfig:
    """The run config: CONFIG (or, without one, a run named reward_model on --model) + overrides + flags."""
    from textgym.config import load_config

    values = {_FLAG_KEYS[k]: str(v) if isinstance(v, Path) else v for k, v in flags.items()}
    if config is not None:
        return load_config(config, overrides, values=values)
    missing = [f"--{k}" for k in ("pairs", "model", "out") if k not in flags]
    if missing:
        fail(f"without a CONFIG, {', '.join(missing)} must be given")
    from textgym.model_pull import PACKAGED_MODELS

    start = values["reward_model.model"]
    key = "name" if start in PACKAGED_MODELS and not Path(start).exists() else "path"
    base = {"name": "reward_model", "model": {key: start}, "reward_model": {}}
    return load_config(None, overrides, values=values, **base)
