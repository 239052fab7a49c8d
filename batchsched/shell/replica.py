"""One replica of ``batchsched run``: the scheduler, leader election and the HTTP server.

With leader election on, every replica lists and watches (its caches stay
warm) but only the lease holder acts: its scheduling loop starts once the
lease is held, and its API client sends and completes writes only while the
lease is certain (``Kube.write_validity``).  A replica that loses the lease exits
with status 1, to come back as a standby; on SIGTERM the holder stops acting
and then releases the lease, so a standby takes over within one retry period.
"""
from __future__ import annotations

import asyncio
import logging
import signal
from typing import Callable

from batchsched.config import SchedulerConfig
from batchsched.kube.client import Kube  # first: it imports aiohttp without reading certificates it never uses
from batchsched.shell import server
from batchsched.shell.heap import collect_rarely, settle_heap
from batchsched.shell.leader import LeaderElector, default_identity, resolve_lease_namespace
from batchsched.shell.metrics import Metrics
from batchsched.shell.scheduler import Scheduler

log = logging.getLogger("batchsched")

EXIT_LOST_LEASE = 1


async def _elector(kubeconfig: str | None, context: str | None, config: SchedulerConfig) -> LeaderElector:
    election = config.leader_election
    return LeaderElector(
        # its own connection pool: renewals never wait behind a burst of bindings
        await Kube.connect(kubeconfig, qps_connections=2, context=context),
        resolve_lease_namespace(election.lease_namespace), election.lease_name, default_identity(),
        lease_duration=election.lease_duration_seconds, renew_deadline=election.renew_deadline_seconds,
        retry_period=election.retry_period_seconds)


async def run_replica(kubeconfig: str | None, config: SchedulerConfig, context: str | None = None) -> int:
    collect_rarely()  # from before the first lists (shell/heap.py)
    kube = await Kube.connect(kubeconfig, context=context)
    elector = await _elector(kubeconfig, context, config) if config.leader_election.enabled else None
    runner = None
    try:
        metrics = Metrics()
        if elector is not None:
            kube.write_validity = elector.validity
            metrics.read_leadership(elector.is_leading)
        scheduler = Scheduler(kube, config, leading=elector.leading if elector else None, metrics=metrics)
        scheduler.on_started = settle_heap  # the caches hold the cluster: keep the collector off them
        runner = await server.serve(config.metrics_bind_address, metrics, _readiness(scheduler, elector),
                                    scheduler.cache.state.dra.claims_unreadable_note)
        await _run_until_stopped(scheduler, elector)
    finally:
        if runner is not None:
            await runner.cleanup()
        if elector is not None:
            await elector.kube.close()
        await kube.close()
    if elector is not None and elector.lost.is_set():
        return EXIT_LOST_LEASE
    log.info("stopped")
    return 0


def _readiness(scheduler: Scheduler, elector: LeaderElector | None) -> Callable[[], str]:
    def not_ready() -> str:
        if not scheduler.ready.is_set():
            unsynced = [r.kind for r in scheduler.reflectors if not r.synced.is_set()]
            return f"watch caches not synced yet ({', '.join(unsynced) or 'settling'})"
        out_of_step = [f"{r.kind} watch not synced since its last error ({r.error})"
                       for r in scheduler.reflectors if r.error]
        if out_of_step:
            return "; ".join(out_of_step)
        if elector is not None and not elector.observed.is_set():
            return f"state of Lease {elector.namespace}/{elector.name} not known yet"
        return ""
    return not_ready


async def _run_until_stopped(scheduler: Scheduler, elector: LeaderElector | None) -> None:
    """Until SIGTERM or SIGINT, the lease is lost, or the scheduler fails (raised here);
    SIGUSR1 makes every watch cache relist."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGUSR1, scheduler.relist)
    scheduling = asyncio.create_task(scheduler.run(), name="scheduler")
    waiting = [scheduling, asyncio.create_task(stop.wait())]
    background: list[asyncio.Task] = []
    if elector is not None:
        background.append(asyncio.create_task(elector.run(), name="leader-election"))
        waiting.append(asyncio.create_task(elector.lost.wait()))
    try:
        await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in waiting + background:
            task.cancel()
        await asyncio.gather(*waiting, *background, return_exceptions=True)
        if elector is not None:
            await elector.release()  # only now that the scheduler has stopped acting
    if not scheduling.cancelled() and scheduling.exception():
        raise scheduling.exception()
