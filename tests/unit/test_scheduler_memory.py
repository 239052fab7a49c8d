"""The scheduler keeps nothing about gangs that are gone (a long-running
scheduler sees PodGroups and lone pods come and go by the million)."""
from __future__ import annotations

import asyncio

from batchsched.config import SchedulerConfig
from batchsched.shell.scheduler import Scheduler


def pod_object(name: str, group: str | None = None, node: str = "") -> dict:
    labels = {"scheduling.batchsched.io/pod-group": group} if group else {}
    return {"metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}", "labels": labels,
                         "creationTimestamp": "2024-01-01T00:00:00Z"},
            "spec": {"schedulerName": "batchsched", "nodeName": node,
                     "containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]},
            "status": {"phase": "Pending"}}


def group_object(name: str, min_member: int) -> dict:
    return {"metadata": {"name": name, "namespace": "default", "generation": 1,
                         "creationTimestamp": "2024-01-01T00:00:00Z"},
            "spec": {"minMember": min_member}}


def test_verdicts_start_times_and_status_of_gone_gangs_are_dropped():
    async def scenario():
        scheduler = Scheduler(kube=None, config=SchedulerConfig())  # type: ignore[arg-type]  # nothing is sent
        cache = scheduler.cache
        cache._replace_nodes({})
        cache._apply_group("ADDED", group_object("g", 2))
        cache._apply_pod("ADDED", pod_object("g-0", group="g"))
        cache._apply_pod("ADDED", pod_object("lone"))
        scheduler.cycle()  # no node: both wait, with verdicts and a status for g
        assert {"default/g", "default/pod:lone"} <= scheduler.verdicts.keys()
        assert scheduler.status.last_written("default/g") is not None
        scheduler.start_times["default/g"] = "2024-01-01T00:00:00Z"
        cache._apply_pod("DELETED", pod_object("lone"))
        cache._apply_pod("DELETED", pod_object("g-0", group="g"))
        scheduler.cycle()
        assert "default/pod:lone" not in scheduler.verdicts
        assert "default/g" in scheduler.verdicts  # its PodGroup is still there
        cache._apply_group("DELETED", group_object("g", 2))
        scheduler.cycle()
        assert not scheduler.verdicts and not scheduler.start_times
        assert scheduler.status.last_written("default/g") is None
    asyncio.run(scenario())
