"""schedulerNames: one batchsched serves several schedulerNames (docs/integrations.md)."""
import asyncio

import pytest

from batchsched.config import ConfigError, validate_config
from batchsched.core.gangs import GangIndex
from batchsched.shell.cache import ClusterCache
from tests.unit.cache_support import relist


def test_without_the_list_the_one_name_is_served():
    config = validate_config({"schedulerName": "gpu-sched"})
    assert config.scheduler_names == ["gpu-sched"] and config.also_serves == ()


def test_the_list_alone_makes_its_first_name_the_default():
    config = validate_config({"schedulerNames": ["mpi-gang", "volcano"]})
    assert config.scheduler_name == "mpi-gang"
    assert config.also_serves == ("volcano",)
    assert config.core().scheduler_name == "mpi-gang"


def test_schedulername_with_the_list_must_lead_it():
    assert validate_config({"schedulerName": "batchsched",
                            "schedulerNames": ["batchsched", "volcano"]}).also_serves == ("volcano",)
    with pytest.raises(ConfigError, match="schedulerNames must start with schedulerName 'batchsched'"):
        validate_config({"schedulerName": "batchsched", "schedulerNames": ["volcano", "batchsched"]})


@pytest.mark.parametrize("data, expected", [
    ({"schedulerNames": ["volcano", "volcano"]}, "schedulerNames: names volcano more than once"),
    ({"schedulerNames": ["Volcano"]}, "schedulerNames: 'Volcano' is not a valid schedulerName"),
    ({"schedulerNames": "volcano"}, "schedulerNames: Input should be a valid list"),
    ({"schedulerNames": [7]}, "schedulerNames.0: Input should be a valid string"),
    ({"schedulerNames": [f"s{i}" for i in range(17)]}, "schedulerNames: List should have at most 16 items"),
    ({"schedulerName": "a" * 254}, "schedulerName: 'aaaa"),
    ({"schedulerName": "bad name"}, "is not a valid schedulerName"),
])
def test_bad_names_are_refused_naming_the_key(data, expected):
    with pytest.raises(ConfigError) as caught:
        validate_config(data)
    assert expected in str(caught.value) and "\n" not in str(caught.value)


def pod(name: str, uid: str, scheduler: str, group: str = "") -> dict:
    labels = {"scheduling.batchsched.io/pod-group": group} if group else {}
    return {"metadata": {"name": name, "namespace": "ns", "uid": uid, "labels": labels},
            "spec": {"schedulerName": scheduler, "containers": [{"name": "c"}]}, "status": {"phase": "Pending"}}


async def new_cache() -> ClusterCache:
    return ClusterCache("batchsched", also_serves=("volcano", "scheduler-plugins-scheduler"))


def test_pods_naming_any_served_name_are_held_under_the_default_and_are_ours():
    cache = asyncio.run(new_cache())
    relist(cache, "pods", [pod("a", "u1", "volcano", group="g"), pod("b", "u2", "scheduler-plugins-scheduler",
                                                                          group="g"),
                           pod("c", "u3", "batchsched", group="g"), pod("d", "u4", "default-scheduler", group="g")])
    assert {p.name: p.scheduler_name for p in cache.pods.values()} == {
        "a": "batchsched", "b": "batchsched", "c": "batchsched", "d": "default-scheduler"}
    gang = GangIndex(cache.snapshot(0.0))["ns/g"]
    assert sorted(p.name for p in gang.members) == ["a", "b", "c"]
    assert [p.name for p in gang.foreign] == ["d"]  # only a name not served is another scheduler's


def test_a_pod_watched_under_a_served_name_is_ours_too():
    cache = asyncio.run(new_cache())
    relist(cache, "pods", [])
    cache._apply_pod("ADDED", pod("a", "u1", "volcano"))
    assert [p.name for p in cache.members("ns/pod:a")] == ["a"]
