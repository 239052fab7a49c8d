"""A one-line progress display on stderr while a simulation or a benchmark
works: long replays (the whole Alibaba trace takes minutes) would otherwise
print nothing until the end.  Shown only when the stream is a terminal,
redrawn at most every ``interval`` seconds of wall time, erased when a run
ends.  One line: the phase (a policy, a benchmark's case), where it is
(simulated time, a step), and items done against the total."""
from __future__ import annotations

import sys
import time
from typing import Callable, TextIO

from batchsched.sim.report import duration


class TerminalProgress:
    def __init__(self, stream: TextIO = sys.stderr, interval: float = 0.5,
                 clock: Callable[[], float] = time.monotonic):
        self.stream = stream
        self.interval = interval
        self.clock = clock
        self._last = -float("inf")
        self._drawn = False

    @classmethod
    def if_terminal(cls, stream: TextIO = sys.stderr) -> "TerminalProgress | None":
        return cls(stream) if stream.isatty() else None

    def update(self, phase: str, simulated_seconds: float, placed: int, total: int) -> None:
        """A simulation's line: ``phase`` is its policy (or a benchmark's case)."""
        self.show(phase, f"{duration(simulated_seconds)} simulated", placed, total, "pods placed")

    def show(self, phase: str, where: str, done: int, total: int, items: str) -> None:
        """``phase: where, done/total items``, unless drawn less than ``interval`` ago."""
        now = self.clock()
        if now - self._last < self.interval:
            return
        self._last = now
        self.stream.write(f"\r\033[K{phase}: {where}, {done}/{total} {items}")
        self.stream.flush()
        self._drawn = True

    def done(self) -> None:
        if self._drawn:
            self.stream.write("\r\033[K")
            self.stream.flush()
            self._drawn = False
        self._last = -float("inf")
