"""GRPO that generates on `textgym serve --weight-sync` servers (127.0.0.1, CPU, gloo).

1. One trainer process and two servers: before the first rollout and after every step both
   servers' weights are bitwise those of the trainer (SHA-256 of the state dict) and report
   the step as their policy version; every trajectory records the version of the step it was
   sampled at; its tokens are exactly what the trainer's own transformers backend samples from
   the same weights, prompt and seed (log-probs to 1e-4: the server batches and pads other
   rows with it, a float-rounding difference).
2. Two trainer ranks (torchrun, gloo) and two servers, continuous rollouts: two steps complete
   and the final weights (rank 0's, gathered from the FSDP shards) equal both servers'.
3. A server killed (SIGKILL) in the middle of the push after step 2 stops the run with a
   non-zero exit naming it; restarted on its port, `--resume` re-pushes step 1's checkpoint
   and completes the run, the servers ending bitwise equal to its final weights.
4. A LoRA policy pushes its adapters only (under a quarter of the full weights' bytes) and the
   server, merging them onto its base, ends bitwise equal to the trainer's merged weights.

Every server and trainer process is killed at teardown.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
import torch
import yaml
from conftest import WARM_ENV

from textgym.agents.sampling import SamplingParams, derive_seed
from textgym.agents.transformers_backend import TransformersBackend
from textgym.config import ConfigError, GRPOConfig
from textgym.distributed.transfer import checksum
from textgym.models import load_model
from textgym.serve.weights import DELAY_ENV
from textgym.trainers.grpo import GRPOTrainer
from textgym.trainers.remote_rollouts import check_servers

pytestmark = pytest.mark.multiproc

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
SAMPLING = {"temperature": 1.0, "max_new_tokens": 6}
# zero rewards for a random model: the entropy bonus is what moves the weights
GRPO = {"env": WARM_ENV, "prompts_per_step": 2, "group_size": 2, "sampling": SAMPLING, "entropy_coef": 0.05}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start(model_dir: Path, port: int, log: Path, **env: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "textgym", "serve", str(model_dir), "--port", str(port), "--weight-sync"]
    cmd += ["--served-model-name", "tiny"]
    return subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, env={**ENV, **env})


def _wait_ready(url: str, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + 120
    while True:
        assert proc.poll() is None, log.read_text()[-3000:]
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, "server did not start in 120 s"
        time.sleep(0.2)


def _kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=30)


@contextmanager
def servers(model_dir: Path, logs: Path, envs: list[dict[str, str]]) -> Iterator[list[list]]:
    """One server per `envs` entry, ready: `[[url, port, process], ...]` (a killed one may be replaced)."""
    procs: list[list] = []
    try:
        for i, env in enumerate(envs):
            port = _free_port()
            procs.append(
                [f"http://127.0.0.1:{port}", port, _start(model_dir, port, logs / f"s{i}.log", **env)]
            )
        for i, (url, _, proc) in enumerate(procs):
            _wait_ready(url, proc, logs / f"s{i}.log")
        yield procs
    finally:
        for _, _, proc in procs:
            _kill(proc)


def _server_sum(url: str) -> tuple[str, int]:
    r = httpx.get(url + "/weights/checksum", timeout=60).json()
    return r["sha256"], r["policy_version"]


def _folder_sum(folder: Path) -> str:
    model, _ = load_model(folder)
    return checksum(model.state_dict().items())


def test_grpo_on_two_servers_keeps_them_equal_to_the_trainer(tiny_model_dir, tmp_path):
    with servers(tiny_model_dir, tmp_path, [{}, {}]) as procs:
        urls = [p[0] for p in procs]
        with pytest.raises(ConfigError, match=f"{urls[0]} serves 'tiny' with a vocabulary of"):
            check_servers(urls, vocab_size=7)
        with pytest.raises(ConfigError, match=r"127\.0\.0\.1:9 is not reachable"):
            check_servers(["http://127.0.0.1:9"], timeout_s=2)
        cfg = GRPOConfig(
            **GRPO,
            steps=2,
            optim={"lr": 1e-3},
            rollout={"servers": urls, "sync_timeout_s": 60, "sync_bucket_mb": 1},
        )
        assert cfg.rollout.use_tis  # the servers sample: TIS by default
        model, tok = load_model(tiny_model_dir)
        trainer = GRPOTrainer(cfg, model, tok, tmp_path / "grpo", seed=3)
        local = TransformersBackend(trainer.policy, tok)
        params = SamplingParams(**SAMPLING)
        seen: list[tuple[int, list]] = []
        collect = trainer.collect

        def checked_collect(n: int, round_index: int = 0) -> list:
            trajs = collect(n, round_index)
            seen.append((trainer.step, trajs))
            # what the trainer's own backend samples for the same prompt and the server's seed
            # (the request's seed, which `textgym serve` derives its row's generator seed from)
            seeds = [
                derive_seed(derive_seed(derive_seed(3, trainer.step, round_index, g, j), 0) % 2**63, 0)
                for g in range(n)
                for j in range(cfg.group_size)
            ]
            with torch.no_grad():
                gens = local.generate([t.token_ids[: t.prompt_length].tolist() for t in trajs], params, seeds)
            for t, g in zip(trajs, gens, strict=True):
                assert t.token_ids[t.prompt_length :].tolist() == g.token_ids
                torch.testing.assert_close(t.logprobs[t.prompt_length :], g.logprobs, atol=1e-4, rtol=0)
            return trajs

        trainer.collect = checked_collect  # type: ignore[method-assign]
        start = checksum(trainer.policy.state_dict().items())
        assert [_server_sum(u) for u in urls] == [(start, 0)] * 2
        for step in (1, 2):
            m = trainer.train_step()
            want = checksum(trainer.policy.state_dict().items())
            assert want != start
            assert [_server_sum(u) for u in urls] == [(want, step)] * 2
            assert m["weight_sync/bytes"] > 0 and "mismatch/tis_clip_frac" in m
        assert [s for s, _ in seen] == [0, 1]
        for step, trajs in seen:
            assert [t.policy_version for t in trajs] == [step] * 4
        trainer.close()


def _write(path: Path, model_dir: Path, grpo: dict) -> Path:
    cfg = {"name": "run", "out_dir": str(path.parent), "threads": 1, "model": {"path": str(model_dir)}}
    path.write_text(yaml.safe_dump({**cfg, "grpo": {**GRPO, **grpo}}), encoding="utf-8")
    return path


def _train(config: Path, ranks: int, *extra: str) -> subprocess.Popen:
    launcher = [sys.executable, "-m", "textgym"]
    if ranks > 1:
        launcher = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={ranks}",
        ]
        launcher += ["-m", "textgym"]
    cmd = [*launcher, "train", str(config), *extra]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=ENV)


def _finish(proc: subprocess.Popen, timeout: float = 300) -> tuple[int, str]:
    try:
        out, _ = proc.communicate(timeout=timeout)
    finally:
        _kill(proc)
    return proc.returncode, out


def _steps(stage: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (stage / "metrics.jsonl").read_text().splitlines()]


def test_two_ranks_and_two_servers(tiny_model_dir, tmp_path):
    with servers(tiny_model_dir, tmp_path, [{}, {}]) as procs:
        urls = [p[0] for p in procs]
        rollout = {"servers": urls, "sync_timeout_s": 60, "sync_bucket_mb": 1, "mode": "continuous"}
        config = _write(tmp_path / "r2.yaml", tiny_model_dir, {"steps": 2, "rollout": rollout})
        code, out = _finish(_train(config, 2))
        assert code == 0, out[-5000:]
        stage = tmp_path / "run" / "grpo"
        assert _steps(stage) == [1, 2]
        want = _folder_sum(stage / "final")
        assert [_server_sum(u) for u in urls] == [(want, 2)] * 2


def test_a_server_killed_mid_sync_stops_the_run_and_resume_completes(tiny_model_dir, tmp_path):
    # the second server sleeps before each bucket, so a push to it lasts long enough to kill it
    with servers(tiny_model_dir, tmp_path, [{}, {DELAY_ENV: "0.3"}]) as procs:
        urls = [p[0] for p in procs]
        rollout = {"servers": urls, "sync_timeout_s": 60, "sync_bucket_mb": 0.5}
        config = _write(
            tmp_path / "kill.yaml", tiny_model_dir, {"steps": 3, "checkpoint_every": 1, "rollout": rollout}
        )
        trainer = _train(config, 1)
        victim = procs[1]
        try:
            deadline = time.monotonic() + 240
            while True:  # the push of version 2 (after step 2's update) in flight to the victim
                assert trainer.poll() is None, trainer.communicate()[0][-5000:]
                assert time.monotonic() < deadline, "the push of version 2 never started"
                s = httpx.get(victim[0] + "/weights/status", timeout=5).json()
                if s["state"] == "receiving" and s["policy_version"] == 1:
                    break
                time.sleep(0.05)
            victim[2].kill()
            code, out = _finish(trainer, timeout=120)
        finally:
            _kill(trainer)
        assert code == 1, out[-5000:]
        assert "WeightSyncError" in out and victim[0] in " ".join(out.split()), out[-5000:]
        assert "--resume" in out
        stage = tmp_path / "run" / "grpo"
        assert _steps(stage) == [1]  # step 2 failed: not logged, not checkpointed
        assert (stage / "checkpoints" / "step_1").is_dir()
        # the server comes back on its port (without the delay); the run resumes and completes
        victim[2] = _start(tiny_model_dir, victim[1], tmp_path / "s1b.log")
        _wait_ready(victim[0], victim[2], tmp_path / "s1b.log")
        code, out = _finish(_train(config, 1, "--resume"))
        assert code == 0, out[-5000:]
        assert _steps(stage) == [1, 2, 3]
        want = _folder_sum(stage / "final")
        assert [_server_sum(u) for u in urls] == [(want, 3)] * 2


def test_a_lora_policy_pushes_its_adapters_and_the_server_merges_them(tiny_model_dir, tmp_path):
    from textgym.agents.weight_sync import merged_state_dict

    with servers(tiny_model_dir, tmp_path, [{}]) as procs:
        url = procs[0][0]
        rollout = {"servers": [url], "sync_timeout_s": 60}
        lora = {"r": 4, "alpha": 8}
        cfg = GRPOConfig(**GRPO, steps=1, optim={"lr": 1e-2}, lora=lora, rollout=rollout)
        model, tok = load_model(tiny_model_dir)
        start = checksum(model.state_dict().items())
        trainer = GRPOTrainer(cfg, model, tok, tmp_path / "grpo", seed=0)
        assert _server_sum(url) == (start, 0)  # fresh adapters (B = 0) merge to the base
        m = trainer.train_step()
        want = checksum(merged_state_dict(trainer.policy).items())
        assert want != start and _server_sum(url) == (want, 1)
        assert m["weight_sync/bytes"] < 1e6 / 4  # the adapters only (the full weights: > 1 MB)
        trainer.close()
