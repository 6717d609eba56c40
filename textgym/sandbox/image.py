"""Build the docker backend's image locally, with no registry: `textgym sandbox build-image`.

The image is a root filesystem holding one Python interpreter, its standard library
(without tests, IDLE, tkinter, site-packages), the shared libraries they link (found with
`ldd`), a two-line passwd, and empty `/work` and `/tmp`; it is loaded with
`docker import` (the Engine API's image create from a tarball). About 40-60 MB.

Users with a registry can skip this and point the backend at any image that has
`python3` on its PATH and runs as root by default (`sandbox_image=` / `TEXTGYM_SANDBOX_IMAGE`).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import subprocess
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

from textgym.sandbox._launcher import SANDBOX_UID
from textgym.sandbox.base import DEFAULT_IMAGE, SandboxError

__all__ = ["build_image", "build_rootfs"]
SKIP_DIRS = frozenset(
    {"site-packages", "dist-packages", "test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3"}
)
_LDD_RE = re.compile(r"(/\S+)")


def _python_layout(python: str) -> dict[str, Any]:
    probe = (
        "import json, sys, sysconfig; print(json.dumps({'stdlib': sysconfig.get_path('stdlib'), "
        "'platstdlib': sysconfig.get_path('platstdlib'), 'version': sys.version.split()[0], "
        "'dynload': [p for p in sys.path if p.endswith('lib-dynload')]}))"
    )
    out = subprocess.run([python, "-I", "-c", probe], capture_output=True, text=True, check=True).stdout
    return json.loads(out)


def _shared_libraries(elf_files: list[str]) -> set[str]:
    libs: set[str] = set()
    for i in range(0, len(elf_files), 64):
        out = subprocess.run(["ldd", *elf_files[i : i + 64]], capture_output=True, text=True).stdout
        for line in out.splitlines():
            if "=>" in line or line.strip().startswith("/"):
                m = _LDD_RE.search(line.split("=>")[-1])
                if m and os.path.exists(m.group(1)):
                    libs.add(m.group(1))
    return libs


class _RootFS:
    """A tar archive of a root filesystem, adding parents, symlinks and targets as needed."""

    def __init__(self, tar: tarfile.TarFile):
        self.tar = tar
        self.seen: set[str] = set()
        for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
            if os.path.islink(top):  # merged /usr: keep the same top-level links
                self._symlink(top, os.readlink(top))

    def _dir(self, path: str, mode: int = 0o755) -> None:
        if path in ("/", "") or path in self.seen:
            return
        self._dir(os.path.dirname(path))
        info = tarfile.TarInfo(path.lstrip("/"))
        info.type, info.mode, info.mtime = tarfile.DIRTYPE, mode, int(time.time())
        self.tar.addfile(info)
        self.seen.add(path)

    def _symlink(self, path: str, target: str) -> None:
        if path in self.seen:
            return
        self._dir(os.path.dirname(path))
        info = tarfile.TarInfo(path.lstrip("/"))
        info.type, info.linkname, info.mode = tarfile.SYMTYPE, target, 0o777
        self.tar.addfile(info)
        self.seen.add(path)

    def data(self, path: str, content: bytes, mode: int = 0o644) -> None:
        """Add a regular file with the given bytes."""
        self._dir(os.path.dirname(path))
        info = tarfile.TarInfo(path.lstrip("/"))
        info.size, info.mode, info.mtime = len(content), mode, int(time.time())
        self.tar.addfile(info, io.BytesIO(content))
        self.seen.add(path)

    def file(self, path: str) -> None:
        """Add a host file at its real location, with a symlink from `path` when `path` is one."""
        canonical = os.path.join(os.path.realpath(os.path.dirname(path)), os.path.basename(path))
        if canonical in self.seen:
            return
        if os.path.islink(canonical):
            target = os.readlink(canonical)
            self._symlink(canonical, target)
            self.file(os.path.join(os.path.dirname(canonical), target))
            return
        self._dir(os.path.dirname(canonical))
        st = os.stat(canonical)
        info = tarfile.TarInfo(canonical.lstrip("/"))
        info.size, info.mode, info.mtime = st.st_size, st.st_mode & 0o7777 & ~0o022, int(st.st_mtime)
        with open(canonical, "rb") as f:
            self.tar.addfile(info, f)
        self.seen.add(canonical)

    def tree(self, root: str) -> list[str]:
        """Add a directory tree (skipping `SKIP_DIRS`); return the ELF shared objects in it."""
        elves = []
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
            self._dir(os.path.realpath(dirpath))
            for name in sorted(filenames):
                path = os.path.join(dirpath, name)
                self.file(path)
                if name.endswith(".so") or ".so." in name:
                    elves.append(path)
        return elves


def build_rootfs(out: str | Path, python: str | None = None) -> dict[str, Any]:
    """Write the sandbox image's root filesystem as a tarball at `out`.

    Args:
        out: the tarball to write.
        python: the interpreter to ship (default: `process.default_python()`).

    Returns:
        `{"python": path, "version": "3.11.2", "files": n, "bytes": size}`.

    Raises:
        SandboxError: when the interpreter cannot be inspected.
    """
    from textgym.sandbox.process import default_python

    python = os.path.realpath(python or default_python())
    try:
        layout = _python_layout(python)
    except (OSError, subprocess.CalledProcessError, json.JSONDecodeError) as e:
        raise SandboxError(f"cannot inspect interpreter {python!r}: {e}") from e
    with tarfile.open(out, "w") as tar:
        fs = _RootFS(tar)
        fs.file(python)
        elves = [python]
        for root in {layout["stdlib"], layout["platstdlib"], *layout["dynload"]}:
            if os.path.isdir(root):
                elves += fs.tree(root)
        for lib in sorted(_shared_libraries(elves)):
            fs.file(lib)
        for name in ("python3", "python"):
            fs._symlink(f"/usr/local/bin/{name}", python)
        fs.data(
            "/etc/passwd",
            f"root:x:0:0:root:/root:/usr/sbin/nologin\nnobody:x:{SANDBOX_UID}:{SANDBOX_UID}::/work:/nonexistent\n".encode(),
        )
        fs.data("/etc/group", f"root:x:0:\nnogroup:x:{SANDBOX_UID}:\n".encode())
        for d in ("/work", "/tmp"):
            fs._dir(d, 0o1777)
        for d in ("/proc", "/dev", "/sys", "/root"):
            fs._dir(d, 0o700 if d == "/root" else 0o755)
        files = len(fs.seen)
    return {"python": python, "version": layout["version"], "files": files, "bytes": os.path.getsize(out)}


def build_image(tag: str = DEFAULT_IMAGE, python: str | None = None, client: Any = None) -> dict[str, Any]:
    """Build the root filesystem and `docker import` it as `tag` into the local engine.

    The image `tag` named before, if any, is removed once the new one has the tag (unless a
    container still uses it).

    Returns:
        `build_rootfs`'s facts plus `"image"` (the tag) and `"id"` (the image id).

    Raises:
        SandboxUnavailableError: when no Docker engine answers.
        SandboxError: when the import fails.
    """
    from textgym.sandbox.docker import connect

    client = client or connect()
    try:
        previous = client.images.get(tag).id
    except Exception:
        previous = None
    repository, _, version = tag.rpartition(":") if ":" in tag.split("/")[-1] else (tag, "", "latest")
    with tempfile.TemporaryDirectory() as tmp:
        tarball = os.path.join(tmp, "rootfs.tar")
        facts = build_rootfs(tarball, python)
        try:
            client.api.import_image_from_file(
                tarball,
                repository=repository,
                tag=version,
                changes=["USER root", "WORKDIR /work", 'ENV PATH="/usr/local/bin:/usr/bin:/bin"'],
            )
            image = client.images.get(tag)
        except Exception as e:
            raise SandboxError(f"docker import of {tarball} as {tag} failed: {e}") from e
    if previous and previous != image.id:  # the old image lost its tag: do not leave it behind
        with contextlib.suppress(Exception):
            client.images.remove(previous)
    return {**facts, "image": tag, "id": image.id}
