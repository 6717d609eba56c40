"""Rows and steps out of the loss, as the papers define them (issue "exact RL round 2").

- A minibatch with no token in the loss takes no optimizer or scheduler step: AdamW's momentum
  and weight decay would move the weights on a zero gradient.
- Rows cut by the overlong filter leave the sequence normaliser as DAPO's filler rows do, so a
  kept row's seq-mean gradient does not depend on how many rows were cut.
- PPO's critic warm-up takes no policy step, so the policy's schedule is sized on the updates
  that remain, and an adaptive β stays put while the policy cannot move.
- The DAPO preset is the paper's recipe: overlong filtering and the soft overlong punishment.
- GAE keeps float64 inputs in float64.
"""

from __future__ import annotations

import copy
import json

import pytest
import torch
from conftest import WARM_ENV

from textgym.agents.sampling import SamplingParams
from textgym.agents.trajectory import Trajectory
from textgym.algorithms.advantages import gae
from textgym.config import GRPOConfig, PPOConfig, load_config
from textgym.models import load_model, load_tokenizer
from textgym.trainers.rl.grpo import GRPOTrainer
from textgym.trainers.rl.ppo import PPOTrainer
from textgym.training.seeding import seed_everything
from textgym.training.shaping import apply_overlong_penalty

SAMPLING = {"temperature": 1.0, "max_new_tokens": 8}


def grpo_cfg(**over) -> GRPOConfig:
    base = {
        "env": WARM_ENV,
        "steps": 4,
        "prompts_per_step": 2,
        "group_size": 2,
        "sampling": SAMPLING,
        "optim": {"lr": 1e-3, "weight_decay": 0.1},
    }
    base.update(over)
    return GRPOConfig.model_validate(base)


def weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_a_minibatch_with_no_loss_token_leaves_the_weights_and_the_schedule_alone(warm_model_dir, tmp_path):
    """Step 1 trains (AdamW now has momentum); at step 2 every response is cut at max_new_tokens
    and the overlong filter leaves no token in the loss: no weight, optimizer state or learning
    rate may change (before the fix AdamW moved every weight on the zero gradient)."""
    seed_everything(0)
    model, tok = load_model(warm_model_dir)
    cfg = grpo_cfg(overlong_filter=True, optim={"lr": 1e-3, "weight_decay": 0.1, "schedule": "linear"})
    trainer = GRPOTrainer(cfg, model, tok, tmp_path)
    first = trainer.train_step()
    assert first["rollout/overlong_masked"] < 1.0
    before, lr = weights(trainer.policy), trainer.scheduler.get_last_lr()[0]
    adam_steps = [float(s["step"]) for s in trainer.optimizer.state.values()]
    # 2 tokens cannot hold an answer ("\boxed{d}" and the end of turn): every response is cut
    trainer.source.params = SamplingParams(**{**cfg.sampling.model_dump(), "max_new_tokens": 2})
    second = trainer.train_step()
    assert second["rollout/overlong_masked"] == 1.0 and second["grad_norm"] == 0.0
    after = weights(trainer.policy)
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert trainer.scheduler.get_last_lr()[0] == lr
    assert [float(s["step"]) for s in trainer.optimizer.state.values()] == adam_steps
    assert first["update/skipped_minibatches"] == 0.0 and second["update/skipped_minibatches"] == 1.0


def test_the_critic_takes_no_step_on_a_minibatch_with_no_loss_token(warm_model_dir, tmp_path):
    """PPO: the critic's positions are the policy's tokens, so an empty minibatch steps neither model."""
    seed_everything(0)
    model, tok = load_model(warm_model_dir)
    cfg = PPOConfig.model_validate(
        {"env": WARM_ENV, "steps": 2, "prompts_per_step": 4, "group_size": 1, "sampling": SAMPLING,
         "overlong_filter": True, "critic": {"optim": {"lr": 1e-3, "weight_decay": 0.1}}}
    )  # fmt: skip
    trainer = PPOTrainer(cfg, model, tok, tmp_path)
    trainer.train_step()
    policy, critic = weights(trainer.policy), weights(trainer.critic.model)
    critic_lr = trainer.critic.scheduler.get_last_lr()[0]
    trainer.source.params = SamplingParams(**{**cfg.sampling.model_dump(), "max_new_tokens": 2})
    m = trainer.train_step()
    assert m["rollout/overlong_masked"] == 1.0
    assert all(torch.equal(policy[k], v) for k, v in weights(trainer.policy).items())
    assert all(torch.equal(critic[k], v) for k, v in weights(trainer.critic.model).items())
    assert trainer.critic.scheduler.get_last_lr()[0] == critic_lr
    assert m["update/skipped_minibatches"] == 1.0


def _captured_gradient(trainer: GRPOTrainer, trajs: list[Trajectory], advantages: torch.Tensor):
    """The policy's gradient at its optimizer step for a step on `trajs` with `advantages`."""
    grads: list[torch.Tensor] = []
    trainer.batch = lambda metrics: [copy.deepcopy(t) for t in trajs]  # type: ignore[method-assign]
    trainer.advantages = lambda batch, trajs, ref, metrics: advantages.clone()

    def capture(optimizer, args, kwargs):
        grads.append(torch.cat([p.grad.flatten() for p in trainer.policy.parameters() if p.grad is not None]))

    trainer.optimizer.register_step_pre_hook(capture)
    trainer.train_step()
    assert len(grads) == 1
    return grads[0]


@pytest.mark.parametrize("aggregation", ["seq_mean_token_mean", "seq_mean_token_sum_norm"])
def test_a_kept_rows_gradient_does_not_depend_on_how_many_rows_were_cut(
    tmp_path, warm_model_dir, aggregation
):
    """Two kept rows with advantages ±1: alone in a batch of 2, or beside 2 rows cut by the
    overlong filter in a batch of 4, the seq-mean gradient is the same (before the fix the cut
    rows stayed in `num_seqs` and halved it). The batches differ only in padding width, so the
    gradients agree to float32 rounding of the padded forward."""
    seed_everything(0)
    model, tok = load_model(warm_model_dir)
    over = {"overlong_filter": True, "loss_aggregation": aggregation, "steps": 1}
    probe = GRPOTrainer(grpo_cfg(**over), copy.deepcopy(model), tok, tmp_path / "probe")
    trajs = probe.collect(2)
    # two kept rows that differ (two equal rows with advantages +1 and -1 cancel to a zero gradient)
    other = next(i for i, t in enumerate(trajs) if i and t.token_ids.tolist() != trajs[0].token_ids.tolist())
    kept = [trajs[0], trajs[other]]
    cut = [copy.deepcopy(t) for i, t in enumerate(trajs) if i not in (0, other)]
    for t in kept:
        t.finish_reason = "stop"
    for t in cut:
        t.finish_reason = "length"
    two = GRPOTrainer(grpo_cfg(prompts_per_step=1, **over), copy.deepcopy(model), tok, tmp_path / "two")
    four = GRPOTrainer(grpo_cfg(**over), copy.deepcopy(model), tok, tmp_path / "four")
    g2 = _captured_gradient(two, kept, torch.tensor([1.0, -1.0]))
    g4 = _captured_gradient(four, kept + cut, torch.tensor([1.0, -1.0, 0.7, -0.3]))
    assert float(g2.norm()) > 1e-3
    torch.testing.assert_close(g4, g2, rtol=1e-4, atol=1e-6 * float(g2.abs().max()))


def test_critic_warmup_sizes_the_policy_schedule_and_freezes_beta(warm_model_dir, tmp_path):
    """4 iterations, 2 of them critic warm-up, a linear schedule to 0: the policy's 2 updates take
    the learning rate to 0 (before the fix it stopped halfway, at lr/2); the adaptive β is the
    same through the warm-up (KL is 0 while the policy cannot move) and moves after."""
    seed_everything(0)
    model, tok = load_model(warm_model_dir)
    cfg = PPOConfig.model_validate(
        {"env": WARM_ENV, "steps": 4, "prompts_per_step": 4, "group_size": 1, "sampling": SAMPLING,
         "critic_warmup_steps": 2, "kl_coef": 0.1, "kl_target": 1.0, "kl_horizon": 10,
         "optim": {"lr": 1e-3, "schedule": "linear"}, "critic": {"optim": {"lr": 1e-3}}}
    )  # fmt: skip
    before = weights(model)
    trainer = PPOTrainer(cfg, model, tok, tmp_path)
    rows = [trainer.train_step() for _ in range(4)]
    assert [r["lr"] for r in rows] == pytest.approx([1e-3, 1e-3, 5e-4, 0.0], abs=1e-12)
    assert trainer.scheduler.get_last_lr()[0] == 0.0
    # β is logged before each update moves it: the same for the warm-up and the first real step
    betas = [r["kl/coef"] for r in rows]
    assert betas[0] == betas[1] == betas[2] == 0.1
    assert betas[3] != 0.1  # the controller works again once the policy trains
    assert any(not torch.equal(before[k], v) for k, v in weights(trainer.policy).items())


def test_the_dapo_preset_is_the_papers_recipe():
    """Clip-higher, dynamic sampling, token-level loss, overlong filtering and the soft overlong
    punishment (Yu et al. 2025, eq. 13) with L_max at the sampling budget, whose window never
    reaches a right answer of the task."""
    cfg = load_config("configs/dapo_arithmetic.yaml").grpo
    assert cfg is not None
    assert cfg.clip_high > cfg.clip_low and cfg.dynamic_sampling and cfg.loss_aggregation == "token_mean"
    assert cfg.overlong_filter and cfg.overlong_penalty is not None
    op = cfg.overlong_penalty
    assert op.max_len == cfg.sampling.max_new_tokens and op.factor == 1.0
    # the longest right answer (a 3-digit sum) and its end of turn stay out of the window
    from textgym.model_init import build_tokenizer

    tok = build_tokenizer("bpe")
    longest = len(tok("\\boxed{198}")["input_ids"]) + 1
    assert longest <= op.max_len - op.cache_len


def test_the_soft_overlong_punishment_pays_a_cut_response_minus_one():
    """Eq. 13 on the preset's window: 0 up to L_max − L_cache, linear to −1 at L_max (a cut response)."""
    op = load_config("configs/dapo_arithmetic.yaml").grpo.overlong_penalty  # type: ignore[union-attr]
    assert op is not None
    trajs = []
    for n in (8, 9, 10):
        ids = torch.arange(3 + n)
        mask = torch.tensor([0.0] * 3 + [1.0] * n)
        zeros = torch.zeros(3 + n)
        trajs.append(Trajectory(ids, mask, zeros, zeros.clone(), prompt_length=3, messages=[], reward=0.0))
    apply_overlong_penalty(trajs, op.max_len, op.cache_len, op.factor)
    assert [t.reward for t in trajs] == [0.0, -0.5, -1.0]
    assert [float(t.token_rewards[-1]) for t in trajs] == [0.0, -0.5, -1.0]


def test_gae_keeps_float64_inputs_in_float64():
    """The vectorised recursion against the hand recursion in float64, to float64 rounding."""
    g = torch.Generator().manual_seed(0)
    rewards = torch.randn(3, 7, generator=g, dtype=torch.float64)
    values = torch.randn(3, 7, generator=g, dtype=torch.float64)
    mask = torch.ones(3, 7, dtype=torch.float64)
    mask[1, 5:] = 0.0
    gamma, lam = 0.99, 0.9
    adv, ret = gae(rewards, values, mask, gamma=gamma, lam=lam)
    assert adv.dtype == ret.dtype == torch.float64
    for b in range(3):
        steps = [t for t in range(7) if mask[b, t] > 0]
        a_next, v_next = 0.0, 0.0
        for t in reversed(steps):
            delta = float(rewards[b, t]) + gamma * v_next - float(values[b, t])
            a_next = delta + gamma * lam * a_next
            v_next = float(values[b, t])
            assert float(adv[b, t]) == pytest.approx(a_next, rel=1e-14, abs=1e-14)
    assert gae(rewards.float(), values.float(), mask.float())[0].dtype == torch.float32


def test_sft_on_a_store_takes_the_env_from_the_store(tiny_model_dir, tmp_path):
    """`sft: {trajectories: PATH}` alone: the store's env (id and kwargs) is the env; a store of
    several envs, or neither field, is a clear error before any work."""
    from textgym.config import ConfigError, SFTConfig, load_config
    from textgym.offline.store import TrajectoryWriter, store_env, trajectory_row
    from textgym.pipeline import preflight

    tok = load_tokenizer(tiny_model_dir)
    ids = tok("<|im_start|>user\nCompute 1+2.<|im_end|>\n<|im_start|>assistant\n")["input_ids"]
    answer = tok("\\boxed{3}")["input_ids"]
    traj = Trajectory(
        token_ids=torch.tensor(ids + answer), loss_mask=torch.tensor([0.0] * len(ids) + [1.0] * len(answer)),
        logprobs=torch.zeros(len(ids) + len(answer)), token_rewards=torch.zeros(len(ids) + len(answer)),
        prompt_length=len(ids), messages=[], reward=1.0, env_id="textgym/Arithmetic-v0", task_id="arith/0",
    )  # fmt: skip
    one = tmp_path / "one"
    with TrajectoryWriter(one) as store:
        store.append([trajectory_row(traj, env_kwargs={"operators": "+", "digits": 1})])
    env = store_env(one)
    assert env.id == "textgym/Arithmetic-v0" and env.kwargs == {"operators": "+", "digits": 1}

    cfg = load_config(
        None, ["name=s", f"model.path={tiny_model_dir}", f"sft.trajectories={one}", "sft.steps=1"]
    )
    assert cfg.sft is not None and cfg.sft.env is None
    preflight(cfg)
    assert cfg.sft.env == env

    with TrajectoryWriter(one) as store:  # a second env in the same store
        store.append([trajectory_row(traj, env_kwargs={"operators": "-", "digits": 1})])
    cfg = load_config(None, ["name=store", f"model.path={tiny_model_dir}", f"sft.trajectories={one}"])
    with pytest.raises(ConfigError, match=r"sft\.trajectories: .* holds episodes of 2 envs .*sft\.env"):
        preflight(cfg)
    with pytest.raises(ValueError, match=r"sft\.env is required"):
        SFTConfig.model_validate({"steps": 1})
    assert json.dumps(SFTConfig.model_validate({"trajectories": str(one)}).model_dump()["env"]) == "null"


def test_the_gradients_are_freed_after_the_update_and_the_step_is_unchanged(warm_model_dir, tmp_path):
    """Memory (docs/models.md#memory): the policy holds no gradient while it samples the next
    rollout (on a 135M model the last update's were 538 MB of the rollout's peak), and freeing
    them, with the heap trim after each step, changes no weight: two runs, one trimming after
    every step, end bitwise equal."""
    from textgym.training.loop import release_free_heap

    finals = []
    for trim in (False, True):
        seed_everything(0)
        model, tok = load_model(warm_model_dir)
        trainer = GRPOTrainer(grpo_cfg(steps=2), model, tok, tmp_path / f"trim{trim}")
        sample = trainer.sample
        held: list[bool] = []

        def watched(metrics, sample=sample, held=held, model=model):
            held.append(any(p.grad is not None for p in model.parameters()))
            return sample(metrics)

        trainer.sample = watched  # type: ignore[method-assign]
        for _ in range(2):
            trainer.train_step()
            if trim:
                release_free_heap()
        assert held == [False, False]  # the second rollout follows an update
        finals.append(weights(model))
    assert finals[0].keys() == finals[1].keys()
    assert all(torch.equal(finals[0][k], finals[1][k]) for k in finals[0])
