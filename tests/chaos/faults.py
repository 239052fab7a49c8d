"""Process faults: SIGKILL a replica part-way through a gang, SIGSTOP a leader.

The moment of a kill is set by the fault proxy, not by polling the pods: the
first ``k`` bindings pass, the rest are held at the proxy, and the replica is
killed while they wait, so exactly ``k`` members are bound whatever the
timing (a poll could not catch a gang that binds in a few milliseconds).
"""
from __future__ import annotations

import os
import signal
import time
from contextlib import contextmanager

from tests.chaos.proxy import BINDING_PATH, FaultProxy, Rule
from tests.support.kube import wait_for


def hold_bindings_after(proxy: FaultProxy, k: int, client: str | None = None) -> Rule:
    """Bindings after the first ``k`` wait at the proxy (add before the replica binds)."""
    return proxy.add_rule("hold", method="POST", path=BINDING_PATH, after=k, client=client)


def committed_bindings(proxy: FaultProxy) -> int:
    return sum(1 for r in proxy.records_of("POST", BINDING_PATH) if r.committed)


def kill_when_held(proxy: FaultProxy, replica, held: Rule, k: int, timeout: float = 30) -> None:
    """SIGKILL ``replica`` once ``k`` bindings are committed and more wait at the
    proxy; the held ones are then dropped (their client is gone), never sent."""
    wait_for(f"{k} bindings committed and more held at the proxy",
             lambda: committed_bindings(proxy) >= k and held.fired >= 1, timeout=timeout)
    replica.kill()
    proxy.clear_rules()
    proxy.release_held()
    assert committed_bindings(proxy) == k, f"{committed_bindings(proxy)} bindings committed, expected {k}"


@contextmanager
def paused(replica, seconds: float):
    """SIGSTOP ``replica`` (a GC pause, a frozen VM) for the body of the with
    block and at least ``seconds`` in all, then SIGCONT."""
    os.kill(replica.proc.pid, signal.SIGSTOP)
    stopped_at = time.monotonic()
    try:
        yield
        left = seconds - (time.monotonic() - stopped_at)
        if left > 0:
            time.sleep(left)  # the pause is the fault: its length is the point
    finally:
        os.kill(replica.proc.pid, signal.SIGCONT)
