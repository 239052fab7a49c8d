"""A leader's lease validity under a test's control (Kube.write_validity)."""
from __future__ import annotations

import time


class HeldLease:
    """Valid for a while by real time; renewed or lost by hand."""

    def __init__(self, seconds: float):
        self.valid_until = time.monotonic() + seconds
        self.lost = False

    def renew(self, seconds: float) -> None:
        self.valid_until = time.monotonic() + seconds

    def validity(self) -> float:
        return 0.0 if self.lost else self.valid_until - time.monotonic()
