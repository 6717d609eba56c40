"""The LLM-judge reward term of the on-policy trainers (`env.judge`, RLAIF).

After each rollout the whole batch goes to the judge at once, so its requests run concurrently
(`judge.concurrency`): pointwise, one request per episode; in group mode, one request per GRPO
group holding every sample (RULER-style relative scores). Each episode's judge reward r ∈ [0, 1]
is added as `weight · r` to its reward and to its last policy token's reward (so PPO's per-token
returns see it), and recorded as `reward_terms["reward/judge"]` (logged as `rollout/judge_mean`)
with the judgement in `info["judge"]`, as DAPO's overlong penalty is added in
`textgym.training.rollout_metrics`. A response that writes something shaped like a verdict
(`judge_verdict.forged_verdict`) is marked `info["judge"]["forged_verdict"]` and counted in
`judge/forged_verdict_frac`: the judge never reads such text, but a policy that writes it is trying.
A response that claims a score or addresses the grader (`judge_claims.claims_score`) is marked
`info["judge"]["claims_score"]` and counted in `judge/claims_score_frac`; a score the judge gives it
equal to its claim is not paid (`judge/adopted`). In group mode each response is judged after its
own conversation (a multi-turn group's episodes differ after the first turn).
"""

from __future__ import annotations

import time

from textgym.agents.trajectory import Trajectory
from textgym.config import ConfigError, JudgeTermConfig
from textgym.types import Message
from textgym.verifiers.base import Score
from textgym.verifiers.judge import JudgeItem, JudgeVerifier, api_key_from_env
from textgym.verifiers.judge_claims import claims_score
from textgym.verifiers.judge_client import JudgeError
from textgym.verifiers.judge_prompts import load_rubric
from textgym.verifiers.judge_verdict import forged_verdict


def conversation_prompt(messages: list[Message]) -> tuple[str, str]:
    """`(prompt, completion)` for the judge: what came before an episode's last assistant turn, and that turn.

    A one-question episode's prompt is the user's message as it is; a longer conversation is
    written as `[role] content` lines. System messages are left out (they instruct the policy).
    """
    last = max((i for i, m in enumerate(messages) if m.get("role") == "assistant"), default=len(messages))
    before = [m for m in messages[:last] if m.get("role") != "system"]
    completion = str(messages[last].get("content") or "") if last < len(messages) else ""
    if len(before) == 1 and before[0].get("role") == "user":
        return str(before[0].get("content") or ""), completion
    return "\n".join(f"[{m.get('role')}] {m.get('content') or ''}" for m in before), completion


def episode_voice(messages: list[Message]) -> tuple[str, str]:
    """`(task, authored)` of an episode: its first user message, and every assistant turn joined.

    What the judge reads claims from (`authored`: the policy's own words, earlier turns included)
    and what makes a score word content rather than a claim (`task`: `judge_claims.score_claims`).
    Never raises (a missing role gives "").
    """
    task = next((str(m.get("content") or "") for m in messages if m.get("role") == "user"), "")
    authored = "\n".join(str(m.get("content") or "") for m in messages if m.get("role") == "assistant")
    return task, authored


def check_judge(cfg: JudgeTermConfig, field: str = "env.judge") -> None:
    """Check before a run that the judge's endpoint answers and serves its model (`GET /v1/models`).

    Raises:
        ConfigError: naming `field`, when it does not (or its API-key variable is not set).
    """
    try:
        judge = JudgeVerifier(
            **{**cfg.verifier_kwargs(), "cache_path": None},
            cache=False,
            api_key=api_key_from_env(cfg.api_key_env),
        )
    except ValueError as e:
        raise ConfigError(f"{field}: {e}") from None
    try:
        judge.check()
    except JudgeError as e:
        raise ConfigError(f"{field}: {e} (start the judge's server first)") from None
    finally:
        judge.close()


class JudgeTerm:
    """A judge and its weight, applied to rollout batches; per-step metrics since the last `pop_metrics`.

    Args:
        cfg: the env's `judge:` settings.
        group_size: samples per task in the batches (group mode judges each group together).

    Raises:
        JudgeError: (when built) the endpoint cannot be reached or does not serve the model.
        ValueError: the API-key variable is not set, or the rubric lacks its placeholders.
    """

    def __init__(self, cfg: JudgeTermConfig, group_size: int):
        rubric = None if cfg.rubric is None else load_rubric(cfg.rubric, cfg.mode)
        self.judge = JudgeVerifier(
            **cfg.verifier_kwargs(), rubric=rubric, api_key=api_key_from_env(cfg.api_key_env)
        )
        self.judge.check()
        self.cfg, self.group_size = cfg, int(group_size)
        self._since = self._counters()
        self._seconds = 0.0
        self._judged = self._forged = self._claiming = 0

    def scores(self, trajs: list[Trajectory]) -> list[Score]:
        """The judge's reward of each trajectory's last assistant turn, in order.

        Raises:
            JudgeError: when the endpoint refuses a request or keeps failing.
            ValueError: in group mode, when the batch is not whole groups of consecutive rows.
        """
        items = []
        for t in trajs:
            prompt, completion = conversation_prompt(t.messages)
            answer = t.info.get("answer")
            task, authored = episode_voice(t.messages)
            ref = None if answer is None else str(answer)
            items.append(JudgeItem(prompt, (completion,), ref, authored=(authored,), task=task))
        if self.cfg.mode == "pointwise":
            return self.judge.score(items)
        G = self.group_size
        if len(trajs) % G or any(
            len({t.group for t in trajs[i : i + G]}) != 1 for i in range(0, len(trajs), G)
        ):
            raise ValueError(f"group judging needs whole groups of {G} consecutive trajectories")
        groups = []
        for i in range(0, len(items), G):
            xs = items[i : i + G]  # each response with its own conversation, not the first one's
            groups.append(
                JudgeItem(
                    xs[0].prompt,
                    tuple(x.completions[0] for x in xs),
                    xs[0].answer,
                    conversations=tuple(x.prompt for x in xs),
                    authored=tuple(a for x in xs for a in (x.authored or ())),
                    task=xs[0].task,
                )
            )
        return [s for group in self.judge.rank(groups) for s in group]

    def apply(self, trajs: list[Trajectory]) -> None:
        """Add `weight · judge reward` to each trajectory in place (reward, last policy token, terms)."""
        t0 = time.perf_counter()
        scores = self.scores(trajs)
        self._seconds += time.perf_counter() - t0
        for t, s in zip(trajs, scores, strict=True):
            add = self.cfg.weight * s.reward
            t.reward += add
            t.reward_terms["reward/judge"] = s.reward
            forged = forged_verdict(conversation_prompt(t.messages)[1])
            task, authored = episode_voice(t.messages)
            claims = claims_score(authored, task)
            self._judged, self._forged = self._judged + 1, self._forged + forged
            self._claiming += claims
            t.info = {**t.info, "judge": {**s.details, "forged_verdict": forged, "claims_score": claims}}
            pos = t.loss_mask.nonzero()
            if len(pos):
                t.token_rewards[int(pos[-1])] += add

    def _counters(self) -> dict[str, float]:
        return {**self.judge.client.stats, **self.judge.counts}

    def pop_metrics(self) -> dict[str, float]:
        """What the judge did since the last call, as metrics.

        `judge/requests` (HTTP attempts), `judge/retries`, `judge/judgements`, `judge/cache_hits`,
        `judge/unparsable`, `judge/echoed` (judgements with a verdict line dropped as an echo of
        the prompt or of a response), `judge/forged_verdict_frac` (the share of the responses
        judged that write a verdict-shaped text: forgery attempts), `judge/claims_score_frac`
        (the share whose policy text claims a score or addresses the grader: injection
        attempts), `judge/claimed` and `judge/adopted` (judged responses that claim a score, and
        those whose score equalled the claim and was not paid), `judge/latency_s_mean` (per
        successful request), the wall time `time/judge_s` of the batches judged, and
        `judge/requests_per_s` over that time.
        """
        now = self._counters()
        d = {k: now[k] - self._since[k] for k in now}
        keys = (
            "requests",
            "retries",
            "judgements",
            "cache_hits",
            "unparsable",
            "echoed",
            "claimed",
            "adopted",
        )
        out = {f"judge/{k}": d[k] for k in keys}
        out["judge/forged_verdict_frac"] = self._forged / self._judged if self._judged else 0.0
        out["judge/claims_score_frac"] = self._claiming / self._judged if self._judged else 0.0
        out["judge/latency_s_mean"] = d["latency_s"] / d["ok"] if d["ok"] > 0 else 0.0
        out["time/judge_s"] = self._seconds
        out["judge/requests_per_s"] = d["requests"] / self._seconds if self._seconds > 0 else 0.0
        self._since, self._seconds = now, 0.0
        self._judged = self._forged = self._claiming = 0
        return out

    def close(self) -> None:
        """Release the judge's threads and connections."""
        self.judge.close()
