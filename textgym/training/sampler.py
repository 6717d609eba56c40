"""Which tasks a step trains on: a deterministic, resumable stream of task indices."""

from __future__ import annotations

import numpy as np

STREAM_STRIDE = 2**40
"""How far apart two seeds' walks of an unbounded task stream start."""


class TaskSampler:
    """Deterministic stream of task indices with a resumable cursor.

    Finite task sets are walked in a fresh permutation per epoch (seeded by
    `(seed, epoch)`); an unbounded stream (`n >= 2**62`, e.g. generated Arithmetic)
    is walked in order from an offset of its own per seed (`seed * STREAM_STRIDE`), so
    the training seed changes which problems are trained, and two seeds' streams do not
    meet within 2**40 tasks (seed 0 walks 0, 1, 2, ...).

    Attributes:
        cursor: number of indices handed out so far (the data cursor saved in checkpoints).
    """

    def __init__(self, n: int, seed: int):
        if n < 1:
            raise ValueError("cannot sample from an empty task set")
        self.n, self.seed, self.cursor = n, seed, 0
        self._perm: np.ndarray | None = None
        self._perm_epoch = -1

    def next(self, k: int) -> list[int]:
        """Return the next `k` task indices."""
        out = []
        for _ in range(k):
            if self.n >= 2**62:
                out.append((self.seed * STREAM_STRIDE + self.cursor) % self.n)
            else:
                epoch, pos = divmod(self.cursor, self.n)
                if epoch != self._perm_epoch:
                    self._perm = np.random.default_rng([self.seed, epoch]).permutation(self.n)
                    self._perm_epoch = epoch
                assert self._perm is not None
                out.append(int(self._perm[pos]))
            self.cursor += 1
        return out
