"""Re-tokenization drift: how often re-rendering a multi-turn conversation gives other tokens.

textgym trains a multi-turn policy on the exact token sequence it sampled under: the first
prompt rendered once, then each turn's sampled ids, then each observation's incremental
rendering (`textgym.agents.rollout.observation_tokens`). A trainer that instead re-renders the
finished conversation with the chat template (`apply_chat_template(messages)`, the text of each
turn re-tokenized) trains on a sequence that can differ from the sampled one: a sampled token
split that is not the tokenizer's own (" 12" sampled as " 1" + "2"), or a template that
rewrites earlier turns. Where it differs, the policy's log-probabilities are those of a context
it never saw, and the importance ratio is off from that token on.

This script rolls out episodes with a model (sampled at T = 1 unless `--temperature 0`) and,
for each, compares the recorded sequence with the re-rendered one, printing:

- drift rate: the share of episodes whose re-rendered tokens differ from the recorded ones;
- policy tokens after the first difference: the share of the policy's tokens whose context
  differs (they would be trained under a context they were not sampled in);
- the same for the oracle's demonstrations (`OracleDemonstrator`, canonical tokenization).

    python bench/retokenization_drift.py [--model PATH] [--env textgym/ToolMath-v0 ...] [--n 64]

Without `--model`, a random tiny model is built (`init_model("tiny")`): its samples are
arbitrary token strings, the worst case; a trained policy samples canonical splits more often.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from typing import Any

import gymnasium as gym

import textgym  # noqa: F401
from textgym.agents import LLMAgent, SamplingParams
from textgym.agents.demonstrator import OracleDemonstrator
from textgym.agents.rollout import rollout
from textgym.model_init import init_model
from textgym.models import load_model

TOOLMATH = {
    "tools": "calculator",
    "schemas_in_prompt": False,
    "operators": "*",
    "digits": 3,
    "instruction": "Use the calculator.",
}
"""configs/agent_toolmath.yaml's ToolMath (the prompts its policy was trained on)."""


def drift(traj: Any, tokenizer: Any) -> tuple[bool, int, int]:
    """(differs, policy tokens after the first difference, policy tokens) of one trajectory.

    The re-rendering is `apply_chat_template(messages, tools=...)` over the whole conversation;
    it is compared over the recorded sequence's length (the template's closing of the last
    turn, which the recording does not hold when the policy ended with another end-of-turn id,
    is not counted as a difference).
    """
    tools = traj.info.get("tools") if isinstance(traj.info, dict) else None
    ids = tokenizer.apply_chat_template(traj.messages, tools=tools or None, tokenize=True, return_dict=False)
    recorded = traj.token_ids.tolist()
    n = len(recorded)
    first = next((i for i in range(min(n, len(ids))) if ids[i] != recorded[i]), None)
    if first is None and len(ids) < n:
        first = len(ids)
    policy = int(traj.loss_mask.sum())
    if first is None:
        return False, 0, policy
    return True, int(traj.loss_mask[first:].sum()), policy


def main() -> None:
    """Roll out, compare, print one JSON line per (env, agent)."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="a model folder (default: a random tiny model)")
    ap.add_argument("--env", nargs="+", default=["textgym/ToolMath-v0", "textgym/Wordle-v0"])
    ap.add_argument("--n", type=int, default=64, help="episodes per env and agent")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    args = ap.parse_args()
    path = args.model or init_model("tiny", tempfile.mkdtemp(prefix="drift-"))
    model, tok = load_model(path)
    params = SamplingParams(temperature=args.temperature, max_new_tokens=args.max_new_tokens)
    for env_id in args.env:
        kwargs = TOOLMATH if env_id == "textgym/ToolMath-v0" else {}
        for name, agent in (("policy", LLMAgent(model, tok)), ("oracle", OracleDemonstrator(tok))):
            envs = [gym.make(env_id, **kwargs) for _ in range(args.n)]
            trajs = rollout(agent, envs, list(range(args.n)), params, max_turns=8, env_id=env_id)
            rows = [drift(t, tok) for t in trajs]
            after = sum(r[1] for r in rows)
            total = sum(r[2] for r in rows)
            turns = sum(sum(m["role"] == "assistant" for m in t.messages) for t in trajs) / len(trajs)
            print(json.dumps({
                "env": env_id, "agent": name, "episodes": len(rows), "turns_mean": round(turns, 2),
                "drift_rate": sum(r[0] for r in rows) / len(rows),
                "policy_tokens_after_drift": after / max(1, total),
            }), flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
