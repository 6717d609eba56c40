"""Demonstrations: an environment's scripted expert played as a policy, recorded token for token.

`OracleDemonstrator` stands where an `LLMAgent` stands in `rollout`: each turn, instead of
sampling, it asks every episode's environment for its `oracle_action(messages)` (the outermost
wrapper that defines one, as `textgym eval --agent oracle` does) and writes that text as the
policy's response in a model's tokenizer: the text's token ids without special tokens, then the
end-of-turn id. Everything else is the rollout's own bookkeeping, so a demonstration is a
`Trajectory` of the same layout as a sampled episode: the first prompt and every environment or
tool turn are rendered by the chat template (loss mask 0), the assistant turns are the
demonstrator's tokens (loss mask 1), and SFT on it trains exactly the tokens a policy would have
to sample to act like the expert, turn after turn (`textgym rollouts collect --agent oracle`,
`sft.trajectories`, `sft.demonstrations`).

Log-probs are 0 (nothing was sampled), so demonstrations are data for supervised learning, not
for an importance ratio.

With `noise` > 0 the demonstrator is perturbed as in DART (Laskey et al. 2017, "DART: Noise
Injection for Robust Imitation Learning", sec. 4): on each turn, with probability `noise`, the
env's `random_action` is played instead of the expert's, and that turn's tokens are context
(loss mask 0, `Generation.sampled` all False). The expert's later turns are trained on as
usual, so SFT sees the expert recover from states off its own path, the states a policy that
imitates it imperfectly reaches: a policy trained only on the expert's path can learn to
follow the path (its own earlier turns) instead of the feedback that chose it.

With `tool_free` > 0 the expert is one a student cannot fully imitate: on a turn where the
expert would call a tool, with probability `tool_free` it answers at once instead, with the
wrapped environment's own `oracle_action` (the correct answer, as an expert who computes it in
its head would give it), and that turn is trained on. A model too small to compute the answer
learns the form of that reply but not its content, so SFT on such demonstrations stops short of
the expert, and RL, which pays only correct answers, can learn that the tool is the way to them
(`configs/smollm2_agent_rl.yaml`). This is the case of demonstrations from a stronger model or a
person: imitable in form, not in skill.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from transformers import PreTrainedTokenizerBase

from textgym.agents.llm_agent import LLMAgent
from textgym.agents.sampling import Generation, SamplingParams
from textgym.types import Message


class _NoSampling:
    """The demonstrator's backend: end-of-turn ids only; it never samples."""

    def __init__(self, eos_ids: list[int]):
        self.eos_ids = eos_ids

    def generate(self, prompts: list[list[int]], params: SamplingParams, **_: Any) -> list[Generation]:
        raise TypeError("OracleDemonstrator does not sample; `rollout` asks it to demonstrate()")


class OracleDemonstrator(LLMAgent):
    """Plays each environment's `oracle_action` as the policy's turns, in `tokenizer`'s tokens.

    Args:
        tokenizer: the tokenizer (with chat template) of the model the demonstrations are for.
        noise: the probability, per turn, of playing the env's `random_action` instead of the
            expert's, as a context turn outside the loss (DART; see the module docstring).
            0 (default): the expert plays every turn.
        seed: seeds the noise's generator (one stream over the episodes in the order played,
            so the same collection plays the same noise).
        tool_free: the probability, per turn on which the expert would call a tool, that it
            answers at once with the wrapped env's own `oracle_action` instead, trained on (see
            the module docstring). 0 (default): the expert calls its tools.

    Raises:
        ValueError: if the tokenizer has no chat template or no EOS token, or `noise` or
            `tool_free` is not in [0, 1].

    Examples:
        >>> import gymnasium as gym, textgym
        >>> from textgym.agents.rollout import rollout
        >>> from textgym.models import load_tokenizer
        >>> from textgym.model_init import init_model
        >>> import tempfile
        >>> tok = load_tokenizer(init_model("tiny", tempfile.mkdtemp()))
        >>> env = gym.make("textgym/ToolMath-v0")
        >>> (traj,) = rollout(OracleDemonstrator(tok), [env], [0], SamplingParams())
        >>> [m["role"] for m in traj.messages], traj.reward
        (['user', 'assistant', 'tool', 'assistant'], 1.0)
    """

    def __init__(
        self, tokenizer: PreTrainedTokenizerBase, noise: float = 0.0, seed: int = 0, tool_free: float = 0.0
    ):
        if tokenizer.eos_token_id is None:
            raise ValueError("the tokenizer has no EOS token to end a demonstrated turn with")
        if not 0.0 <= noise < 1.0:
            raise ValueError(f"noise must be in [0, 1), got {noise!r}")
        if not 0.0 <= tool_free <= 1.0:
            raise ValueError(f"tool_free must be in [0, 1], got {tool_free!r}")
        self.tool_free = float(tool_free)
        super().__init__(None, tokenizer, backend=_NoSampling([int(tokenizer.eos_token_id)]))
        self.noise = float(noise)
        self.rng = np.random.default_rng(seed)

    def _maybe_tool_free(self, env: gym.Env, messages: Sequence[Message], text: str) -> str:
        """The wrapped env's own answer instead of the expert's tool call, with prob. `tool_free`.

        A turn is a tool turn when the outermost oracle's reply differs from the innermost
        env's (`ToolUseWrapper.oracle_action` calls a tool there); only those turns draw.
        """
        inner = getattr(env.unwrapped, "oracle_action", None)
        if inner is None:
            return text
        direct = str(inner(list(messages)))
        if direct == text or float(self.rng.random()) >= self.tool_free:
            return text
        return direct

    def demonstrate(
        self, envs: Sequence[gym.Env], conversations: Sequence[list[Message]]
    ) -> list[Generation]:
        """One demonstrated turn per episode: the env's oracle reply as token ids + end-of-turn.

        Args:
            envs: each episode's environment (its `oracle_action` is read through wrappers).
            conversations: each episode's messages so far (what the oracle reads).

        Returns:
            One `Generation` per episode: [N] ids (the reply's tokens, then EOS), [N] zero
            log-probs, finish reason "stop"; a noise turn's `sampled` is [N] False.

        Raises:
            AttributeError: if an environment has no `oracle_action` (or, with `noise`, no
                `random_action`).
            ValueError: if a reply's tokens do not decode back to the reply (the tokenizer
                cannot write it: the environment would receive other text than the oracle's).
        """
        out = []
        for env, messages in zip(envs, conversations, strict=True):
            try:
                oracle = env.get_wrapper_attr("oracle_action")
            except AttributeError:
                name = env.spec.id if env.spec else repr(env)
                raise AttributeError(f"{name} has no oracle_action to demonstrate") from None
            noisy = self.noise > 0 and float(self.rng.random()) < self.noise
            if noisy:
                try:
                    random_action = env.get_wrapper_attr("random_action")
                except AttributeError:
                    name = env.spec.id if env.spec else repr(env)
                    raise AttributeError(f"{name} has no random_action to inject as noise") from None
                text = str(random_action(self.rng))
            else:
                text = str(oracle(list(messages)))
                if self.tool_free > 0:
                    text = self._maybe_tool_free(env, messages, text)
            ids = [int(t) for t in self.tokenizer(text, add_special_tokens=False)["input_ids"]]
            back = self.tokenizer.decode(ids, skip_special_tokens=False)
            if back != text:
                raise ValueError(
                    f"the tokenizer cannot write the oracle's reply: {text[:80]!r} "
                    f"decodes back as {back[:80]!r}"
                )
            ids.append(self.backend.eos_ids[0])
            sampled = [False] * len(ids) if noisy else None
            zeros = torch.zeros(len(ids))
            out.append(Generation(token_ids=ids, logprobs=zeros, finish_reason="stop", sampled=sampled))
        return out
