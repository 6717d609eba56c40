from __future__ import annotations

import gymnasium as gym
import pytest
import torch
from conftest import (
    HOSTILE_DECODING_CONFIG,
    EchoTurnsEnv,
    check_exact_sampling,
    hostile_copy,
)

import textgym  # noqa: F401
from textgym.agents import LLMAgent, SamplingParams, rollout
from textgym.training.batch import RolloutBatch
from textgym.training.logprobs import sequence_logprobs


@pytest.fixture(params=["bpe", "byte"])
def agent(request, tiny_model_dir, tiny_byte_model_dir):
    torch.manual_seed(0)
    return LLMAgent.from_pretrained(
        tiny_model_dir if request.param == "bpe" else tiny_byte_model_dir, batch_size=8
    )


def test_single_turn_tokens_decode_to_what_the_env_saw(agent):
    envs = [gym.make("textgym/Arithmetic-v0", split="test") for _ in range(6)]
    trajs = rollout(agent, envs, [0, 1, 2], SamplingParams(max_new_tokens=12), group_size=2)
    assert [t.group for t in trajs] == [0, 0, 1, 1, 2, 2]
    for t, env in zip(trajs, envs, strict=True):
        seen = env.unwrapped._transcript[1]["content"]  # what the env received in step()
        policy = t.token_ids[t.loss_mask.bool()].tolist()
        if t.finish_reason == "stop":
            assert policy[-1] == agent.tokenizer.eos_token_id
            policy = policy[:-1]
        assert agent.tokenizer.decode(policy) == seen == t.messages[-1]["content"]
        prompt = agent.tokenizer.apply_chat_template(
            t.messages[:1], add_generation_prompt=True, tokenize=False
        )
        assert agent.tokenizer.decode(t.token_ids[: t.prompt_length].tolist()) == prompt
        assert t.token_rewards.sum() == t.reward and t.token_rewards[-1] == t.reward
        assert t.loss_mask[: t.prompt_length].sum() == 0


@pytest.mark.parametrize("continuous", [False, True])
def test_a_prefilled_reply_is_context_and_the_env_scores_stem_and_continuation(agent, continuous):
    from textgym.agents.continuous import rollout_continuous

    envs = [gym.make("textgym/Arithmetic-v0", split="test", prefill=True) for _ in range(4)]
    run = rollout_continuous if continuous else rollout
    trajs = run(agent, envs, [0, 1], SamplingParams(max_new_tokens=6), group_size=2, seeds=[1, 2, 3, 4])
    for t, env in zip(trajs, envs, strict=True):
        stem = env.unwrapped.answer_stems(env.unwrapped.task)[0]
        seen = env.unwrapped._transcript[1]["content"]
        assert seen == t.messages[-1]["content"] and seen.startswith(stem)
        rendered = agent.tokenizer.apply_chat_template(
            t.messages[:1], add_generation_prompt=True, tokenize=False
        )
        stem_ids = agent.tokenizer(stem, add_special_tokens=False)["input_ids"]
        prompt = t.token_ids[: t.prompt_length].tolist()
        assert agent.tokenizer.decode(prompt) == rendered + stem and prompt[-len(stem_ids) :] == stem_ids
        assert t.loss_mask[: t.prompt_length].sum() == 0 and t.loss_mask[t.prompt_length :].all()
        policy = t.token_ids[t.prompt_length :].tolist()
        if t.finish_reason == "stop":
            policy = policy[:-1]
        assert stem + agent.tokenizer.decode(policy) == seen
        env.reset(options={"task_index": t.task_index})
        assert env.step(seen)[1] == t.reward  # the whole reply is what was scored


def test_sampling_logprobs_equal_the_training_forward(agent):
    envs = [gym.make("textgym/Arithmetic-v0", split="test") for _ in range(8)]
    for temperature in (1.0, 0.7):
        trajs = rollout(
            agent,
            envs,
            [0, 1, 2, 3],
            SamplingParams(temperature=temperature, max_new_tokens=10),
            group_size=2,
        )
        batch = RolloutBatch.from_trajectories(trajs, agent.tokenizer.pad_token_id)
        with torch.no_grad():
            lp, _ = sequence_logprobs(agent.model, batch, temperature)
        diff = ((lp - batch.old_logprobs) * batch.loss_mask).abs().max()
        assert diff < 1e-4


def test_greedy_is_deterministic_and_top_k_restricts(agent):
    env = [gym.make("textgym/Arithmetic-v0", split="test") for _ in range(2)]
    a = rollout(agent, env, [5], SamplingParams(temperature=0.0, max_new_tokens=8), group_size=2)
    assert torch.equal(a[0].token_ids, a[1].token_ids)
    with torch.no_grad():
        b = RolloutBatch.from_trajectories(a[:1], agent.tokenizer.pad_token_id)
        out = agent.model(input_ids=b.input_ids, attention_mask=b.attention_mask, position_ids=b.position_ids)
    argmax = out.logits[0, b.prompt_width - 1 : -1].argmax(-1)
    assert torch.equal(
        argmax[: a[0].response_length], b.input_ids[0, b.prompt_width :][: a[0].response_length]
    )


def test_multi_turn_tokens_are_the_template_rendering(agent):
    envs = [EchoTurnsEnv() for _ in range(4)]
    trajs = rollout(agent, envs, [0, 1], SamplingParams(max_new_tokens=6), group_size=2)
    tok = agent.tokenizer
    for t in trajs:
        # 1 per turn; a reply that is only the end-of-turn token (a legitimate sample of the random
        # tiny model, P ≈ 0.4 % per turn) is an invalid action and scores 0
        replies = [m["content"] for m in t.messages if m["role"] == "assistant"]
        per_turn = [1.0 if r.strip() else 0.0 for r in replies]
        assert t.reward == sum(per_turn) and t.reward_terms.get("reward/turn", 0.0) == sum(per_turn)
        assert [m["role"] for m in t.messages] == [
            "user",
            "assistant",
            "tool",
            "assistant",
            "tool",
            "assistant",
        ]
        # rewards sit on the last policy token of each turn
        mask = t.loss_mask.tolist()
        turn_ends = [i for i in range(len(mask)) if mask[i] == 1 and (i + 1 == len(mask) or mask[i + 1] == 0)]
        assert len(turn_ends) == 3
        assert t.token_rewards[turn_ends].tolist() == per_turn  # and nowhere else:
        assert float(t.token_rewards.sum()) == sum(per_turn)
        # what the policy saw and sampled is exactly the chat template's rendering of the conversation
        rendered = tok.apply_chat_template(t.messages, tokenize=False)
        text = tok.decode(t.token_ids.tolist())
        if t.finish_reason == "stop":
            assert text + "\n" == rendered
        else:  # the last turn was cut: the template would have closed it
            assert text + "<|im_end|>\n" == rendered


def test_rollout_batch_layout_and_select():
    from textgym.agents.trajectory import Trajectory

    def traj(prompt, resp, group):
        ids = torch.tensor(prompt + resp)
        mask = torch.tensor([0.0] * len(prompt) + [1.0] * len(resp))
        lp = torch.tensor([0.0] * len(prompt) + [-0.5] * len(resp))
        rew = torch.zeros(len(ids))
        rew[-1] = 1.0
        return Trajectory(ids, mask, lp, rew, len(prompt), [], 1.0, group=group)

    b = RolloutBatch.from_trajectories([traj([1, 2, 3], [4, 5], 0), traj([6], [7, 8, 9, 10], 1)], pad_id=0)
    assert b.prompt_width == 3
    assert b.input_ids.tolist() == [[1, 2, 3, 4, 5, 0, 0], [0, 0, 6, 7, 8, 9, 10]]
    assert b.position_ids.tolist()[1][2:] == [0, 1, 2, 3, 4]
    assert b.loss_mask.tolist() == [[1, 1, 0, 0], [1, 1, 1, 1]]
    assert b.token_rewards.tolist() == [[0, 1, 0, 0], [0, 0, 0, 1]]
    s = b.select([0])
    assert (
        s.input_ids.tolist() == [[1, 2, 3, 4, 5]] and s.prompt_width == 3 and s.loss_mask.tolist() == [[1, 1]]
    )
    s = b.select([1])
    assert s.input_ids.tolist() == [[6, 7, 8, 9, 10]] and s.prompt_width == 1
    with pytest.raises(ValueError):
        RolloutBatch.from_trajectories([], 0)


def test_agent_rejects_unknown_backend_and_missing_folder(tiny_model_dir, tmp_path):
    with pytest.raises(ValueError, match="backend"):
        LLMAgent.from_pretrained(tiny_model_dir, backend="tgi")
    with pytest.raises(FileNotFoundError, match="model init"):
        LLMAgent.from_pretrained(tmp_path / "nope")


def test_act_returns_text(tiny_model_dir):
    agent = LLMAgent.from_pretrained(tiny_model_dir)
    out = agent.act(
        [{"role": "user", "content": "Compute 1+1."}], SamplingParams(temperature=0, max_new_tokens=5)
    )
    assert isinstance(out, str)


def test_shared_prompt_forward_equals_the_plain_forward(tiny_model_dir):
    from textgym.training.logprobs import shared_prompt_rows

    torch.manual_seed(0)
    agent = LLMAgent.from_pretrained(tiny_model_dir)
    envs = [gym.make("textgym/Arithmetic-v0", split="test") for _ in range(12)]
    trajs = rollout(agent, envs, [3, 1, 2], SamplingParams(max_new_tokens=8), group_size=4)
    batch = RolloutBatch.from_trajectories(trajs, agent.tokenizer.pad_token_id)
    sub = batch.select([5, 0, 9, 4, 11])  # a shuffled minibatch with partial groups
    assert shared_prompt_rows(sub) is not None
    # responses of several lengths (the tiny model runs to the budget): cut rows short, as EOS would
    P = sub.prompt_width
    for row, length in enumerate([8, 2, 5, 1, 8]):
        sub.attention_mask[row, P + length :] = 0
        sub.loss_mask[row, length:] = 0
        sub.input_ids[row, P + length :] = agent.tokenizer.pad_token_id
    results = []
    # plain; shared prompts with the default buckets; shared prompts, one bucket per length
    for share, overhead in ((False, 32), (True, 32), (True, 0)):
        agent.model.zero_grad()
        lp, ent = sequence_logprobs(
            agent.model, sub, 0.7, with_entropy=True, share_prompts=share, bucket_overhead=overhead
        )
        (lp * sub.loss_mask * torch.linspace(0.5, 1.5, sub.loss_mask.shape[1])).sum().backward()
        grad = torch.cat([p.grad.flatten() for p in agent.model.parameters()])
        results.append((lp.detach() * sub.loss_mask, ent * sub.loss_mask, grad))
    lp0, e0, g0 = results[0]
    for lp1, e1, g1 in results[1:]:
        torch.testing.assert_close(lp1, lp0, rtol=0, atol=1e-5)
        torch.testing.assert_close(e1, e0, rtol=0, atol=1e-5)
        # float32 sums in another order: compare against the gradient's own scale
        assert float((g1 - g0).norm() / g0.norm()) < 1e-5
        assert float((g1 - g0).abs().max() / g0.abs().max()) < 1e-5
    # rows that claim one group but hold different prompts are not shared
    bad = batch.select([0, 4])
    bad.groups = torch.tensor([0, 0])
    assert shared_prompt_rows(bad) is None
    assert shared_prompt_rows(batch.select([0, 4, 8])) is None  # every group once: nothing to share


def test_length_buckets_are_the_cheapest_contiguous_cut():
    import itertools
    import random

    from textgym.training.shared_prompts import length_buckets

    def cost(buckets, lengths, overhead):
        return sum(len(b) * max(lengths[i] for i in b) + overhead for b in buckets)

    rng = random.Random(0)
    for _ in range(200):
        lengths = [rng.choice([0, 1, 3, 4, 5, 12, 32]) for _ in range(rng.randint(1, 7))]
        overhead = rng.choice([0, 4, 32])
        got = length_buckets(lengths, overhead)
        assert sorted(i for b in got for i in b) == list(range(len(lengths)))
        # brute force over every cut of the sorted order
        order = sorted(range(len(lengths)), key=lambda i: lengths[i])
        best = min(
            cost([order[a:b] for a, b in itertools.pairwise((0, *cuts, len(order)))], lengths, overhead)
            for k in range(len(order))
            for cuts in itertools.combinations(range(1, len(order)), k)
        )
        assert cost(got, lengths, overhead) == best
    # one long response among short ones gets a bucket of its own
    assert length_buckets([4] * 15 + [32], 32) == [list(range(15)), [15]]
    assert length_buckets([], 32) == []


def test_shared_prefill_generation_matches_unshared(agent):
    env = gym.make("textgym/Arithmetic-v0", split="test")
    prompts = []
    for i in range(3):
        obs, _ = env.reset(options={"task_index": i})
        prompts.append(agent.encode_prompt(obs))
    params = SamplingParams(temperature=0.0, max_new_tokens=8)
    alone = [agent.generate([p], params)[0] for p in prompts]  # nothing repeats: no shared prefill
    grouped = agent.generate([p for p in prompts for _ in range(3)], params)  # each prompt 3 times
    for k, gen in enumerate(grouped):
        ref = alone[k // 3]
        assert gen.token_ids == ref.token_ids and gen.finish_reason == ref.finish_reason
        torch.testing.assert_close(gen.logprobs, ref.logprobs, rtol=0, atol=1e-4)


@pytest.mark.sandbox
def test_tool_env_prompt_carries_the_tool_schemas(agent):
    envs = [gym.make("textgym/ToolMath-v0") for _ in range(2)]
    trajs = rollout(agent, envs, [0], SamplingParams(max_new_tokens=8), group_size=2)
    schemas = envs[0].reset(options={"task_index": 0})[1]["tools"]
    prompt = agent.tokenizer.apply_chat_template(
        trajs[0].messages[:1], tools=schemas, add_generation_prompt=True, tokenize=False
    )
    assert '"name": "calculator"' in prompt and '"name": "python"' in prompt
    assert agent.tokenizer.decode(trajs[0].token_ids[: trajs[0].prompt_length].tolist()) == prompt


def _record_segments(monkeypatch, agent):
    """Record what the policy generated and what the rollout appended, call by call."""
    import importlib

    rollout_module = importlib.import_module("textgym.agents.rollout")  # the package re-exports `rollout`

    generated: list[list[int]] = []
    appended: list[list[int]] = []
    real_generate, real_obs = agent.generate, rollout_module.observation_tokens

    def generate(prompts, params):
        gens = real_generate(prompts, params)
        generated.extend(g.token_ids for g in gens)
        return gens

    def observation_tokens(*args, **kwargs):
        ids = real_obs(*args, **kwargs)
        appended.append(list(ids))
        return ids

    monkeypatch.setattr(agent, "generate", generate)
    monkeypatch.setattr(rollout_module, "observation_tokens", observation_tokens)
    return generated, appended


@pytest.mark.parametrize("template", ["append_only", "rewrites_history"])
def test_multi_turn_trajectory_is_exactly_what_was_generated_and_appended(agent, monkeypatch, template):
    if template == "rewrites_history":  # a Qwen3-like template that drops earlier <think> blocks
        from textgym.models import CHAT_TEMPLATE

        plain = "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
        strip = (
            "{%- set c = message['content'].split('</think>')[-1].lstrip('\\n') "
            "if (message['role'] == 'assistant' and not loop.last) else message['content'] %}"
            "{{- '<|im_start|>' + message['role'] + '\\n' + c + '<|im_end|>\\n' }}"
        )
        assert plain in CHAT_TEMPLATE
        monkeypatch.setattr(agent.tokenizer, "chat_template", CHAT_TEMPLATE.replace(plain, strip))
        # the policy thinks aloud every turn (scripted tokens: the tiny model would not)
        from textgym.agents.sampling import Generation

        reply = agent.tokenizer("<think>hmm</think>\n\\boxed{zz}", add_special_tokens=False)["input_ids"]
        reply = [*reply, agent.tokenizer.eos_token_id]
        monkeypatch.setattr(
            agent,
            "generate",
            lambda prompts, params: [
                Generation(list(reply), torch.zeros(len(reply)), "stop") for _ in prompts
            ],
        )
    generated, appended = _record_segments(monkeypatch, agent)
    env = gym.make("textgym/Wordle-v0")
    (t,) = rollout(agent, [env], [3], SamplingParams(max_new_tokens=5))
    assert (
        t.truncated and len(generated) == 6 and len(appended) == 5
    )  # 6 unreadable guesses, cut by TimeLimit
    prompt = t.token_ids[: t.prompt_length].tolist()
    expected, mask = list(prompt), [0] * len(prompt)
    for k, gen in enumerate(generated):
        expected += gen
        mask += [1] * len(gen)
        if k < len(appended):
            expected += appended[k]
            mask += [0] * len(appended[k])
    assert t.token_ids.tolist() == expected
    assert t.loss_mask.tolist() == mask
    # decoding each masked-in run gives back the agent's message of that turn
    replies = [m["content"] for m in t.messages if m["role"] == "assistant"]
    eos = agent.tokenizer.eos_token_id
    for gen, reply in zip(generated, replies, strict=True):
        ids = gen[:-1] if gen and gen[-1] == eos else gen
        assert agent.tokenizer.decode(ids) == reply
    # the env's feedback messages are what was appended (between the template's markers)
    feedback = [m["content"] for m in t.messages if m["role"] == "user"][1:]
    for ids, text in zip(appended, feedback, strict=True):
        assert text in agent.tokenizer.decode(ids)
    if template == "rewrites_history":  # what the policy saw keeps every <think>; a re-rendering would not
        seen = agent.tokenizer.decode(t.token_ids.tolist())
        rerendered = agent.tokenizer.apply_chat_template(t.messages, tokenize=False)
        assert seen.count("<think>hmm</think>") == 6 and rerendered.count("<think>hmm</think>") == 1


def test_check_template_cli(tiny_model_dir, tmp_path):
    import json
    import shutil

    from typer.testing import CliRunner

    from textgym.cli import app

    r = CliRunner().invoke(app, ["check-template", str(tiny_model_dir)], catch_exceptions=False)
    assert r.exit_code == 0 and "append-only: yes" in r.output
    bad = tmp_path / "bad"
    shutil.copytree(tiny_model_dir, bad)
    config = json.loads((bad / "tokenizer_config.json").read_text())
    template = config.get("chat_template")
    if template is None:  # transformers 5 keeps it in its own file
        template = (bad / "chat_template.jinja").read_text()
    plain = "message['content'] + '<|im_end|>"
    assert plain in template
    stripped = template.replace(
        plain,
        "(message['content'].split('</think>')[-1].lstrip('\\n') if (message['role'] == 'assistant' "
        "and not loop.last) else message['content']) + '<|im_end|>",
    )
    if "chat_template" in config:
        config["chat_template"] = stripped
        (bad / "tokenizer_config.json").write_text(json.dumps(config))
    else:
        (bad / "chat_template.jinja").write_text(stripped)
    r = CliRunner().invoke(app, ["check-template", str(bad)], catch_exceptions=False)
    assert r.exit_code == 1 and "append-only: NO" in r.output and "rendering rewrites turn 1" in r.output
    assert "growing token sequence" in r.output


def _seeded_decode(model, prompt, temperature, seed, max_new_tokens, eos_ids):
    """Seeded sampling written out by hand: plain forward passes, softmax(logits / T), one float64
    uniform u per step from one generator seeded with `seed`, and the token whose float64 CDF
    interval holds u (what `SeededSample` promises)."""
    g = torch.Generator().manual_seed(seed)
    ids, out = list(prompt), []
    with torch.no_grad():
        for _ in range(max_new_tokens):
            scores = model(input_ids=torch.tensor([ids])).logits[0, -1].float() / temperature
            cdf = torch.softmax(scores, -1).double().cumsum(0)
            u = float(torch.rand(1, 1, dtype=torch.float64, generator=g)) * float(cdf[-1])
            t = next(v for v in range(len(cdf)) if u < float(cdf[v]))
            out.append(t)
            ids.append(t)
            if t in eos_ids:
                break
    return out


@pytest.mark.parametrize("folder", ["untouched", "hostile"])
@pytest.mark.parametrize("seeded", [False, True], ids=["unseeded", "seeded"])
def test_transformers_backend_samples_exactly_the_params_not_the_folder(
    folder, seeded, tiny_model_dir, hostile_model_dir
):
    torch.manual_seed(0)
    agent = LLMAgent.from_pretrained(tiny_model_dir if folder == "untouched" else hostile_model_dir)
    if seeded:

        def generate(prompts, params):
            return agent.generate(prompts, params, seeds=[1000 + i for i in range(len(prompts))])

    else:
        generate = agent.generate
    check_exact_sampling(generate, agent.model, agent.tokenizer, agent.backend.eos_ids)
    if seeded:  # each seeded sample is the hand-written inverse-CDF decode of its seed
        prompt = agent.encode_prompt([{"role": "user", "content": "Compute 1+2."}])
        for T in (1.0, 0.7):
            gens = generate([prompt] * 4, SamplingParams(temperature=T, max_new_tokens=8))
            for i, gen in enumerate(gens):
                assert gen.token_ids == _seeded_decode(
                    agent.model, prompt, T, 1000 + i, 8, agent.backend.eos_ids
                )


def test_decoding_method_fields_of_the_folder_do_not_apply(tiny_model_dir, tmp_path):
    # num_beams, prompt lookup, guidance, watermarking, low_memory on top of every sampling field
    folder = hostile_copy(tiny_model_dir, tmp_path / "hostile", HOSTILE_DECODING_CONFIG)
    torch.manual_seed(0)
    agent = LLMAgent.from_pretrained(folder)
    saved = agent.model.generation_config
    before = saved.to_dict()
    check_exact_sampling(agent.generate, agent.model, agent.tokenizer, agent.backend.eos_ids)
    # the model keeps its own generation config, unchanged (a user saving the model saves it)
    assert agent.model.generation_config is saved and saved.to_dict() == before
    assert saved.num_beams == 4 and saved.top_k == 1


def test_lora_policy_samples_exactly_the_params(hostile_model_dir):
    from textgym.config import LoraSettings
    from textgym.models import load_model
    from textgym.training.lora import apply_lora

    torch.manual_seed(0)
    model, tok = load_model(hostile_model_dir)
    policy = apply_lora(model, LoraSettings(r=4, alpha=8))
    for p in policy.parameters():  # non-zero adapters, so the policy is not the base model
        if p.requires_grad:
            torch.nn.init.normal_(p, std=0.05)
    agent = LLMAgent(policy, tok)
    check_exact_sampling(agent.generate, policy, tok, agent.backend.eos_ids)


def test_finished_rows_leave_the_batch_and_one_step_of_logits_is_held(tiny_model_dir, monkeypatch):
    """The decode loop runs the model's forward pass (never `generate`): each step returns one [b, 1, V]
    of logits, and once a quarter of the rows have sampled their end of turn they leave the batch, so
    later steps run fewer rows. The tokens are those each row gets alone (per-row seeds)."""
    agent = LLMAgent.from_pretrained(tiny_model_dir)
    V = agent.model.config.vocab_size
    shapes: list[tuple[int, ...]] = []
    real_forward = agent.model.forward

    def forward(*args, **kwargs):
        out = real_forward(*args, **kwargs)
        shapes.append(tuple(out.logits.shape))
        return out

    monkeypatch.setattr(agent.model, "forward", forward)
    monkeypatch.setattr(agent.model, "generate", None)  # not called
    prompt = agent.encode_prompt([{"role": "user", "content": "Compute 3+4."}])
    eos = agent.backend.eos_ids[0]
    # a budget of 12; rows end when they sample their end of turn: force it for half of them early
    real_decode_forward = forward

    def ending_forward(*args, **kwargs):
        out = real_decode_forward(*args, **kwargs)
        if sum(s[0] == 8 for s in shapes) == 3:  # the logits of each row's third token: rows 0-3 end
            out.logits[:4, -1, :] = -1e9
            out.logits[:4, -1, eos] = 0.0
        return out

    monkeypatch.setattr(agent.model, "forward", ending_forward)
    seeds = list(range(8))
    gens = agent.generate([prompt] * 8, SamplingParams(max_new_tokens=12), seeds=seeds)
    assert all(s[1] == 1 and s[2] == V for s in shapes)  # one position of logits per call
    rows = [s[0] for s in shapes]
    assert rows[0] == 1  # the 8 copies of the prompt are prefilled once (all but its last token)
    assert rows[1] == 8 and rows[-1] == 4 and sorted(rows[1:], reverse=True) == rows[1:]  # it only shrinks
    assert all(len(g.logprobs) == len(g.token_ids) for g in gens)
    assert [g.finish_reason for g in gens[:4]] == ["stop"] * 4 and all(
        len(g.token_ids) == 3 for g in gens[:4]
    )


def test_a_seeded_row_samples_the_same_tokens_alone_and_in_a_shrinking_batch(warm_model_dir):
    """Rows leaving the batch change neither another row's draws (its own generator) nor its log-probs
    beyond batch rounding (the warm model ends its answers, at different lengths)."""
    agent = LLMAgent.from_pretrained(warm_model_dir)
    prompts = [agent.encode_prompt([{"role": "user", "content": f"Compute {i}+{i + 3}."}]) for i in range(6)]
    params = SamplingParams(temperature=1.0, max_new_tokens=24)
    seeds = [11, 12, 13, 14, 15, 16]
    together = agent.generate(prompts, params, seeds=seeds)
    apart = [agent.generate([p], params, seeds=[s])[0] for p, s in zip(prompts, seeds, strict=True)]
    assert len({len(g.token_ids) for g in together}) > 1  # rows did end at different steps
    assert [g.token_ids for g in together] == [g.token_ids for g in apart]
    for a, b in zip(together, apart, strict=True):
        torch.testing.assert_close(a.logprobs, b.logprobs, rtol=0, atol=1e-5)


@pytest.mark.parametrize("sampled", ["<|im_end|>", "<|endoftext|>"])
def test_a_turn_ends_with_exactly_the_end_of_turn_token_sampled(
    sampled, tiny_model_dir, tmp_path, monkeypatch
):
    import json
    import shutil

    from textgym.agents.sampling import Generation

    # As Qwen2.5 base models ship: the tokenizer's EOS is <|endoftext|>, the chat template closes
    # turns with <|im_end|>, and generation_config.json stops at both.
    folder = tmp_path / "two_eos"
    shutil.copytree(tiny_model_dir, folder)
    tok_config = json.loads((folder / "tokenizer_config.json").read_text())
    tok_config["eos_token"] = "<|endoftext|>"
    (folder / "tokenizer_config.json").write_text(json.dumps(tok_config))
    agent = LLMAgent.from_pretrained(folder)
    tok = agent.tokenizer
    im_end, endoftext = tok.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    assert tok.eos_token_id == endoftext
    gen_config = json.loads((folder / "generation_config.json").read_text())
    gen_config["eos_token_id"] = [im_end, endoftext]
    (folder / "generation_config.json").write_text(json.dumps(gen_config))
    agent = LLMAgent.from_pretrained(folder)
    assert agent.backend.eos_ids == sorted([im_end, endoftext])
    # the policy ends every turn with `sampled` (a scripted policy: the random tiny model would not)
    end = tok.convert_tokens_to_ids(sampled)
    reply = [*tok("I think so", add_special_tokens=False)["input_ids"], end]
    monkeypatch.setattr(
        agent,
        "generate",
        lambda prompts, params: [Generation(list(reply), torch.zeros(len(reply)), "stop") for _ in prompts],
    )
    (t,) = rollout(agent, [EchoTurnsEnv()], [0], SamplingParams(max_new_tokens=6))
    assert [m["role"] for m in t.messages] == ["user", "assistant", "tool", "assistant", "tool", "assistant"]
    assert all(m["content"] == "I think so" for m in t.messages if m["role"] == "assistant")
    ids = t.token_ids.tolist()
    # each assistant turn ends with exactly one end-of-turn token, the one sampled ...
    policy_ends = [i for i in range(len(ids)) if t.loss_mask[i] == 1 and ids[i] in (im_end, endoftext)]
    assert len(policy_ends) == 3 and all(ids[i] == end for i in policy_ends)
    for i in policy_ends[:-1]:
        assert ids[i + 1] not in (im_end, endoftext)
    # ... and the sequence is the template's rendering, with the sampled token where the template
    # closes the assistant turn
    rendered = tok.apply_chat_template(t.messages, tokenize=False)
    seen = tok.decode(ids).replace(sampled, "<|im_end|>")
    assert seen + "\n" == rendered


def test_inverse_cdf_sample_draws_from_the_given_distribution(monkeypatch):
    from textgym.agents.transformers_backend import inverse_cdf_sample

    # by hand: weights (0, 1, 0, 3) -> cumulative (0, 1, 1, 4); u·4 in [0, 1) -> 1, in [1, 4) -> 3
    probs = torch.tensor([[0.0, 1.0, 0.0, 3.0]])
    for u, expected in [(0.0, 1), (0.2499, 1), (0.25, 3), (0.9, 3), (1.0 - 2**-53, 3)]:
        monkeypatch.setattr(torch, "rand", lambda *a, u=u, **k: torch.full((1, 1), u, dtype=torch.float64))
        assert int(inverse_cdf_sample(probs)) == expected
    # u·total rounding up to total itself: the draw is the last token of positive mass, not a
    # zero-mass token after it and not one past the end
    monkeypatch.setattr(torch, "rand", lambda *a, **k: torch.ones(1, 1, dtype=torch.float64))
    assert int(inverse_cdf_sample(torch.tensor([[0.5, 0.5, 0.0, 0.0]]))) == 1
    monkeypatch.undo()
    # against the distribution: 200k draws, chi-square over 18 categories (the 99.9 % point is 40.8)
    torch.manual_seed(0)
    p = torch.softmax(torch.randn(20) * 2, -1)
    p[3] = p[19] = 0.0
    counts = torch.bincount(inverse_cdf_sample(p.expand(200_000, -1).contiguous())[:, 0], minlength=20)
    expected_counts = p.double() / p.double().sum() * 200_000
    kept = expected_counts > 0
    chi2 = float(((counts - expected_counts) ** 2 / expected_counts)[kept].sum())
    assert chi2 < 40.8 and counts[3] == 0 and counts[19] == 0
    for bad in ([0.0, 0.0], [float("nan"), 1.0], [float("inf"), 1.0]):
        with pytest.raises(RuntimeError, match="inf, nan"):
            inverse_cdf_sample(torch.tensor([bad]))
