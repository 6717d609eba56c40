"""Evaluation: measure a policy on environments, run suites with confidence intervals, plot runs.

- `core`: `evaluate` (accuracy, mean reward, pass@k, lengths, throughput; resumable),
  `EvalResult`, `pass_at_k` (and `episode_correct`, from `textgym.agents.trajectory`)
- `suites`: eval suites from YAML, reports with Wilson/bootstrap intervals, `compare_reports`
- `scripted`: oracle and random agents, the bounds any policy is read against
- `plotting`: PNG training curves from a run directory
- `envcheck`: `check_env` (what `textgym env check` runs) and the train pre-flight's `preflight_episode`
- `job`: what `textgym eval` runs (`run_eval` on an `EvalJobConfig`: agent, env or suite, report)

`from textgym.evaluation import evaluate` (and the other names of `core`) keeps working.
"""

from textgym.agents.trajectory import episode_correct
from textgym.evaluation.core import EvalResult, EvaluationInterruptedError, evaluate, pass_at_k
from textgym.evaluation.envcheck import CheckResult, check_env
from textgym.evaluation.scripted import OracleAgent, RandomAgent, evaluate_scripted

__all__ = [
    "CheckResult",
    "EvalResult",
    "EvaluationInterruptedError",
    "OracleAgent",
    "RandomAgent",
    "check_env",
    "episode_correct",
    "evaluate",
    "evaluate_scripted",
    "pass_at_k",
]
