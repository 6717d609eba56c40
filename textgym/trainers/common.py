"""The old home of what every trainer shares; each concern now has its own module.

- `seeding`: `seed_everything`, `resolve_device`
- `logprobs`: `sequence_logprobs`, `shared_prompt_rows`
- `batch`: `RolloutBatch`, `rank_micro_batches`
- `sampler`: `TaskSampler`
- `optim`: `build_optimizer`, `load_optimizer`, `save_optimizer`
- `logging`: `MetricsLogger`, `NullLogger`, `metrics_logger`, `progress_bar`
- `checkpoint`: `save_checkpoint`, `load_checkpoint`, `latest_checkpoint`, `load_weights`,
  `save_model_folder`, `save_final`, `save_lora_final` (the run directory's layout)
- `loop`: `run_loop`, `Trainable`

The names are re-exported here so that `from textgym.trainers.common import ...` keeps working.
"""

from textgym.trainers.batch import rank_micro_batches
from textgym.trainers.checkpoint import (
    latest_checkpoint,
    load_checkpoint,
    load_weights,
    save_checkpoint,
    save_final,
    save_lora_final,
    save_model_folder,
)
from textgym.trainers.logging import MetricsLogger, NullLogger, metrics_logger, progress_bar
from textgym.trainers.logprobs import sequence_logprobs, shared_prompt_rows
from textgym.trainers.loop import Trainable, run_loop
from textgym.trainers.optim import build_optimizer, load_optimizer, save_optimizer
from textgym.trainers.sampler import TaskSampler
from textgym.trainers.seeding import resolve_device, seed_everything

__all__ = [
    "MetricsLogger",
    "NullLogger",
    "TaskSampler",
    "Trainable",
    "build_optimizer",
    "latest_checkpoint",
    "load_checkpoint",
    "load_optimizer",
    "load_weights",
    "metrics_logger",
    "progress_bar",
    "rank_micro_batches",
    "resolve_device",
    "run_loop",
    "save_checkpoint",
    "save_final",
    "save_lora_final",
    "save_model_folder",
    "save_optimizer",
    "seed_everything",
    "sequence_logprobs",
    "shared_prompt_rows",
]
