"""The progress display of `textgym.model_pull.pull`: rich bars on stderr, or nothing.

Stderr keeps stdout clean for what commands print there (`textgym eval --json`, the folder that
`textgym model pull` prints).
"""

from __future__ import annotations

from collections.abc import Iterator
from types import TracebackType
from typing import IO, Any

CHUNK = 1 << 20
"""Bytes read at a time when hashing or extracting."""


class BytesTask:
    """One byte-counting bar (a download); `update` takes the bytes done and the total."""

    def __init__(self, progress: Any, task: Any):
        self._progress = progress
        self._task = task

    def update(self, done: int, total: int) -> None:
        """Show `done` of `total` bytes."""
        if self._progress is not None:
            self._progress.update(self._task, completed=done, total=total)

    def finish(self) -> None:
        """Stop the bar where it is."""
        if self._progress is not None:
            self._progress.stop_task(self._task)


class PullProgress:
    """Bars for a pull's steps: download and checksum in bytes, conversion steps with elapsed time.

    Args:
        enabled: draw on stderr; False makes every method a no-op.
    """

    def __init__(self, enabled: bool):
        self._progress: Any = None
        self._step: Any = None
        if enabled:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                DownloadColumn,
                Progress,
                SpinnerColumn,
                TextColumn,
                TimeElapsedColumn,
            )
            from rich.text import Text

            class Bytes(DownloadColumn):
                """Bytes done / total, for the tasks that count bytes only."""

                def render(self, task: Any) -> Text:
                    return super().render(task) if task.fields.get("bytes") else Text("")

            self._progress = Progress(
                SpinnerColumn(),
                TextColumn("{task.description}"),
                BarColumn(),
                Bytes(),
                TimeElapsedColumn(),
                console=Console(stderr=True),
                transient=False,
            )

    def __enter__(self) -> PullProgress:
        if self._progress is not None:
            self._progress.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._progress is not None:
            self._end_step()
            self._progress.stop()

    def bytes_task(self, description: str, total: int) -> BytesTask:
        """A new byte-counting bar of `total` bytes (updated by the caller)."""
        if self._progress is None:
            return BytesTask(None, None)
        return BytesTask(self._progress, self._progress.add_task(description, total=total, bytes=True))

    def read_chunks(self, f: IO[bytes], size: int, description: str) -> Iterator[bytes]:
        """Yield `f`'s bytes in chunks, advancing a bar of `size` bytes named `description`."""
        task = (
            None if self._progress is None else self._progress.add_task(description, total=size, bytes=True)
        )
        while chunk := f.read(CHUNK):
            if task is not None:
                self._progress.advance(task, len(chunk))
            yield chunk

    def step(self, name: str) -> None:
        """Start a conversion step (a spinner with its elapsed time); the previous one is marked done."""
        if self._progress is None:
            return
        self._end_step()
        self._step = self._progress.add_task(f"convert: {name}", total=None)

    def _end_step(self) -> None:
        if self._step is not None:
            self._progress.update(self._step, total=1, completed=1)
            self._progress.stop_task(self._step)
            self._step = None

    def done(self, message: str) -> None:
        """Close the last step and print `message` under the bars."""
        if self._progress is None:
            return
        self._end_step()
        self._progress.console.print(message)
