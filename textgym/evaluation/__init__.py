"""Evaluation: measure a policy on environments, run suites with confidence intervals, plot runs.

- `core`: `evaluate` (accuracy, mean reward, pass@k, lengths, throughput; resumable),
  `EvalResult`, `pass_at_k`, `episode_correct`
- `suites`: eval suites from YAML, reports with Wilson/bootstrap intervals, `compare_reports`
- `scripted`: oracle and random agents, the bounds any policy is read against
- `plotting`: PNG training curves from a run directory
- `job`: what `textgym eval` runs (`run_eval` on an `EvalJobConfig`: agent, env or suite, report)

`from textgym.evaluation import evaluate` (and the other names of `core`) keeps working.
"""

from textgym.evaluation.core import (
    EvalResult,
    EvaluationInterruptedError,
    episode_correct,
    evaluate,
    pass_at_k,
)

__all__ = ["EvalResult", "EvaluationInterruptedError", "episode_correct", "evaluate", "pass_at_k"]
