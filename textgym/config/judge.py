"""The LLM-judge reward term of an environment (`env.judge:` in an RL stage's config)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


class JudgeTermConfig(BaseModel):
    """An LLM judge behind an OpenAI-compatible endpoint, as a term of the env's reward (RLAIF).

    After each rollout the on-policy trainers (GRPO family, PPO) ask the judge about every
    episode's last assistant turn (the conversation before it is the judge's `{prompt}`) and
    add `weight · judge_reward` to the episode's reward, logged as `reward/judge`; the env's
    own terms (`reward/correct`, ...) stay as they are (set e.g. `correct_weight: 0` in the
    env's kwargs to train on the judge alone while `reward/correct` still measures accuracy).
    See `textgym.verifiers.judge.JudgeVerifier` for the modes, the rubric and the retries.
    """

    # The rules of `textgym.config.base._Strict` (which imports this module for `EnvConfig`).
    model_config = ConfigDict(extra="forbid", validate_default=True)

    endpoint: str = Field(..., min_length=1)
    """Base URL of the judge's server, e.g. "http://127.0.0.1:8008" (with or without /v1)."""
    model: str = Field(..., min_length=1)
    """The served judge model's name."""
    mode: Literal["pointwise", "group"] = "pointwise"
    """"pointwise": one request per episode, reward = SCORE / 10. "group": one request per GRPO
    group with every sample in it, each scored relative to the others (RULER-style)."""
    weight: float = 1.0
    """Scale of the judge's reward (in [0, 1]) in the episode's reward."""
    rubric: str | None = None
    """A rubric template file for `mode` (plain text with {prompt} and {completion}, or
    {completions} in group mode, and {verdict_format}, the per-request verdict tags; see
    `textgym.verifiers.judge_prompts`); null: the built-in one."""
    reference: bool = False
    """Show the task's gold answer to the judge (`{answer}`, `{reference}` in the rubric)."""
    temperature: float = Field(0.0, ge=0.0, le=2.0)
    """The judge's sampling temperature (0: greedy)."""
    max_tokens: int = Field(512, ge=1, le=32768)
    """The judge's reply budget, in tokens."""
    neutral_sampling: bool = True
    """Also send top_k=0, min_p=0 and neutral penalties so that a vLLM-style server takes nothing
    from the judge model's generation_config.json; false for endpoints that refuse those fields."""
    concurrency: int = Field(8, ge=1, le=1024)
    """Judge requests in flight at once."""
    timeout_s: float = Field(60.0, gt=0.0)
    """Per-request timeout, seconds."""
    max_retries: int = Field(4, ge=0, le=20)
    """Retries of a 429, 5xx, timeout or dropped connection (exponential backoff; Retry-After honoured)."""
    backoff_s: float = Field(0.5, ge=0.0)
    """The first retry's delay, doubled at each retry (at most 30 s)."""
    cache: str | None = None
    """A JSONL file that keeps every judgement and is reloaded by later runs; null: in memory only."""
    api_key_env: str | None = None
    """Name of the environment variable holding the endpoint's API key (keys never go in configs)."""
    max_chars: int = Field(20_000, ge=100)
    """Prompts and completions longer than this many characters reach the judge cut to head and tail."""

    @field_validator("endpoint")
    @classmethod
    def _http(cls, v: str) -> str:
        if not v.startswith(("http://", "https://")):
            raise ValueError(f"endpoint must start with http:// or https://, got {v!r}")
        return v

    def verifier_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of `JudgeVerifier` (the API key read from `api_key_env` by the caller)."""
        return {
            "endpoint": self.endpoint,
            "model": self.model,
            "mode": self.mode,
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
            "neutral_sampling": self.neutral_sampling,
            "reference": self.reference,
            "concurrency": self.concurrency,
            "timeout_s": self.timeout_s,
            "max_retries": self.max_retries,
            "backoff_s": self.backoff_s,
            "cache_path": self.cache,
            "max_chars": self.max_chars,
        }
