"""The machinery every trainer uses and no algorithm lives in.

Nothing here imports `textgym.trainers` (a rule `tests/test_layout.py` enforces).

- `batch`: `RolloutBatch` (trajectories → padded tensors) and micro-batching by rows or tokens
- `logprobs`: chunked per-token log-probabilities and entropies of a batch under a model
- `checkpoint`, `optim`, `seeding`: save / resume (weights, optimizer, RNG, trainer state)
- `precision`, `placement`, `lora`: dtypes and autocast, devices and sharding, LoRA adapters
- `loop`: the step loop with logging and checkpoints; `sampler`: the task sampler
- `envs`: the env a trainer steps (reward-model and process-reward wrappers applied)
- `rollout_metrics`: rollout statistics, the overlong penalty, trajectory logging
- `judge_reward`: an LLM judge's score as a reward term
- `sources`: where rollouts come from besides the trainer's own model: a vLLM engine, remote
  rollout servers, an asynchronous producer
"""
