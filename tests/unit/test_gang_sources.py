"""Gang sources: pods and PodGroups stamped by job frameworks in
scheduler-plugins' and Volcano's conventions, read into the core's gangs
(docs/integrations.md).  Pods and PodGroups are shaped as MPI Operator and
KubeRay's Volcano mode write them."""
from __future__ import annotations

import asyncio

import pytest

from batchsched.core import gangsources
from batchsched.core.cycle import schedule_cycle
from batchsched.core.gangs import GangIndex
from batchsched.core.gangsources import schedulerplugins, volcano
from batchsched.core.readers import pod_from_json
from batchsched.core.queueing.queue import GangQueue
from batchsched.core.status import Counters
from batchsched.shell.cache import ClusterCache
from tests.support.frameworks import kuberay_volcano_cluster, mpi_operator_job
from tests.unit.cache_support import relist

OWN_LABEL = "scheduling.batchsched.io/pod-group"
SP_LABEL = "scheduling.x-k8s.io/pod-group"
VOLCANO_ANNOTATION = "scheduling.k8s.io/group-name"
ALL = frozenset(gangsources.PRECEDENCE)


def pod_json(name: str, *, labels=None, annotations=None, scheduler="batchsched", gpus=8, ns="train") -> dict:
    return {"metadata": {"name": name, "namespace": ns, "uid": f"uid-{ns}-{name}", "labels": labels or {},
                         "annotations": annotations or {}, "creationTimestamp": "2024-01-01T00:00:00Z"},
            "spec": {"schedulerName": scheduler,
                     "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]},
            "status": {"phase": "Pending"}}


def listed(objects: list[dict]) -> list[dict]:
    """Objects as the API server lists them: with a uid and a creation time."""
    for obj in objects:
        obj["metadata"].update(uid=f"uid-{obj['metadata']['name']}", creationTimestamp="2024-01-01T00:00:00Z")
    return objects


def mpi_operator_pods(job: str, workers: int, scheduler="batchsched") -> list[dict]:
    return listed(mpi_operator_job(job, "train", workers, 8, scheduler)[1])


def sp_group(name: str, ns="train", **spec) -> dict:
    return {"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup",
            "metadata": {"name": name, "namespace": ns, "generation": 1}, "spec": spec}


def kuberay_volcano_pods(cluster: str, workers: int) -> list[dict]:
    return listed(kuberay_volcano_cluster(cluster, "train", workers, 8)[1])


def volcano_group(name: str, ns="train", **spec) -> dict:
    return {"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
            "metadata": {"name": name, "namespace": ns, "generation": 1}, "spec": spec}


# ---- which source claims a pod ------------------------------------------------

@pytest.mark.parametrize("labels, annotations, enabled, expected", [
    ({OWN_LABEL: "a", SP_LABEL: "b"}, {VOLCANO_ANNOTATION: "c"}, ALL, ("batchsched", "a")),
    ({SP_LABEL: "b"}, {VOLCANO_ANNOTATION: "c"}, ALL, ("scheduler-plugins", "b")),
    ({}, {VOLCANO_ANNOTATION: "c"}, ALL, ("volcano", "c")),
    ({SP_LABEL: "b"}, {VOLCANO_ANNOTATION: "c"}, frozenset({"batchsched", "volcano"}), ("volcano", "c")),
    ({SP_LABEL: "b"}, {VOLCANO_ANNOTATION: "c"}, frozenset({"batchsched"}), ("", "")),
    ({SP_LABEL: ""}, {VOLCANO_ANNOTATION: "c"}, ALL, ("volcano", "c")),  # an empty value claims nothing
    ({}, {VOLCANO_ANNOTATION: "x" * 254}, ALL, ("", "")),  # no object has that name
    ({VOLCANO_ANNOTATION: "c"}, {SP_LABEL: "b"}, ALL, ("", "")),  # label and annotation are not interchangeable
])
def test_the_first_enabled_source_in_precedence_claims_the_pod(labels, annotations, enabled, expected):
    assert gangsources.pod_group(labels, annotations, enabled) == expected


def test_foreign_gangs_have_keys_of_their_own_so_equal_names_never_merge():
    own = pod_from_json(pod_json("a", labels={OWN_LABEL: "job"}), ALL)
    sp = pod_from_json(pod_json("b", labels={SP_LABEL: "job"}), ALL)
    vc = pod_from_json(pod_json("c", annotations={VOLCANO_ANNOTATION: "job"}), ALL)
    assert (own.gang_key, sp.gang_key, vc.gang_key) == ("train/job", "train/scheduler-plugins:job", "train/volcano:job")
    assert [gangsources.source_of_key(k) for k in (own.gang_key, sp.gang_key, vc.gang_key, "train/pod:x")] == [
        "batchsched", "scheduler-plugins", "volcano", "batchsched"]
    assert pod_from_json(pod_json("b", labels={SP_LABEL: "job"})).gang_key == "train/pod:b"  # source off: alone


# ---- their PodGroups -------------------------------------------------------------

def test_a_scheduler_plugins_podgroup_reads_min_member_and_min_resources():
    spec = schedulerplugins.group_from_json(sp_group("pi", minMember=5, minResources={"nvidia.com/gpu": "32"},
                                                     scheduleTimeoutSeconds=60))
    assert (spec.key, spec.min_member, spec.min_resources, spec.source) == (
        "train/scheduler-plugins:pi", 5, {"nvidia.com/gpu": 32}, "scheduler-plugins")
    assert spec.schedule_timeout_seconds is None  # Permit's wait in scheduler-plugins: nothing to fail here


def test_a_volcano_podgroup_reads_its_fields_and_its_priority():
    spec = volcano.group_from_json(volcano_group("ray-c-pg", minMember=3, minTaskMember={"headgroup": 1},
                                                 minResources={"cpu": "2"}, queue="default",
                                                 priorityClassName="high"), priority=1000)
    assert (spec.key, spec.min_member, spec.min_resources, spec.priority, spec.priority_class) == (
        "train/volcano:ray-c-pg", 3, {"cpu": 2000}, 1000, "high")


@pytest.mark.parametrize("read", [schedulerplugins.group_from_json, volcano.group_from_json])
def test_min_member_zero_or_left_out_asks_no_gang(read):
    make = sp_group if read is schedulerplugins.group_from_json else volcano_group
    assert read(make("g", minMember=0)).min_member == 1
    assert read(make("g")).min_member == 1


@pytest.mark.parametrize("spec, expected", [
    ({"minMember": -1}, "spec.minMember: Input should be greater than or equal to 0"),
    ({"minMember": 10**12}, "spec.minMember: Input should be less than or equal to 100000"),
    ({"minMember": "4"}, "spec.minMember: Input should be a valid integer"),
    ({"minMember": 4.5}, "spec.minMember: Input should be a valid integer"),
    ({"minMember": True}, "spec.minMember: Input should be a valid integer"),
    ({"minMember": None}, "spec.minMember: Input should be a valid integer"),
    ({"minResources": {"nvidia.com/gpu": "1e20"}}, "spec.minResources: "),
    ({"minResources": ["gpu"]}, "spec.minResources: Input should be a valid dictionary"),
    ({"scheduleTimeoutSeconds": -5}, "spec.scheduleTimeoutSeconds: Input should be greater than or equal to 0"),
])
def test_hostile_scheduler_plugins_specs_are_refused_naming_the_field(spec, expected):
    with pytest.raises(ValueError) as caught:
        schedulerplugins.group_from_json(sp_group("g", **spec))
    assert expected in str(caught.value)


@pytest.mark.parametrize("spec, expected", [
    ({"minMember": -3}, "spec.minMember: Input should be greater than or equal to 0"),
    ({"minMember": 2**40}, "spec.minMember: Input should be less than or equal to 100000"),
    ({"minTaskMember": {"worker": -1}}, "spec.minTaskMember.worker: Input should be greater than or equal to 0"),
    ({"minTaskMember": {"worker": "all"}}, "spec.minTaskMember.worker: Input should be a valid integer"),
    ({"minTaskMember": {f"t{i}": 1 for i in range(65)}}, "spec.minTaskMember: Dictionary should have at most 64"),
    ({"queue": "Not A Queue"}, "spec.queue: String should match pattern"),
    ({"priorityClassName": 7}, "spec.priorityClassName: Input should be a valid string"),
])
def test_hostile_volcano_specs_are_refused_naming_the_field(spec, expected):
    with pytest.raises(ValueError) as caught:
        volcano.group_from_json(volcano_group("g", **spec))
    assert expected in str(caught.value)


def test_a_spec_that_is_not_a_mapping_is_refused_not_raised_past_the_reader():
    for read, make in ((schedulerplugins.group_from_json, sp_group), (volcano.group_from_json, volcano_group)):
        obj = make("g")
        obj["spec"] = ["minMember", 3]
        with pytest.raises(ValueError, match="spec: Input should be a valid dictionary"):
            read(obj)


# ---- the cache, as the shell feeds it --------------------------------------------------

async def new_cache(sources=("scheduler-plugins", "volcano")) -> ClusterCache:
    return ClusterCache("batchsched", also_serves=("volcano",), gang_sources=sources)


def test_the_cache_reads_one_reflector_per_enabled_foreign_crd_each_optional():
    cache = asyncio.run(new_cache())
    foreign = [r for r in cache.reflectors(None) if r.kind.startswith("podgroups.")]  # type: ignore[arg-type]
    assert [(r.kind, r.path, r.optional) for r in foreign] == [
        ("podgroups.scheduling.x-k8s.io", "/apis/scheduling.x-k8s.io/v1alpha1/podgroups", True),
        ("podgroups.scheduling.volcano.sh", "/apis/scheduling.volcano.sh/v1beta1/podgroups", True)]
    off = asyncio.run(new_cache(sources=()))
    assert not [r for r in off.reflectors(None) if r.kind.startswith("podgroups.")]  # type: ignore[arg-type]


def mpi_and_ray_cache(workers: int = 2) -> ClusterCache:
    cache = asyncio.run(new_cache())
    cache.priority_classes = {"high": 1000}
    relist(cache, "podgroups.scheduling.x-k8s.io", [sp_group("pi", minMember=workers + 1)])
    relist(cache, "podgroups.scheduling.volcano.sh", [volcano_group("ray-c-pg", minMember=workers + 1,
                                                                    priorityClassName="high")])
    relist(cache, "pods", mpi_operator_pods("pi", workers) + kuberay_volcano_pods("c", workers))
    return cache


def test_pods_stamped_by_mpi_operator_and_kuberay_form_their_gangs():
    cache = mpi_and_ray_cache()
    gangs = GangIndex(cache.snapshot(0.0))
    assert sorted(gangs) == ["train/scheduler-plugins:pi", "train/volcano:ray-c-pg"]
    mpi, ray = gangs["train/scheduler-plugins:pi"], gangs["train/volcano:ray-c-pg"]
    assert (mpi.min_member, len(mpi.pending), mpi.implicit, mpi.problem) == (3, 3, False, None)
    assert (ray.min_member, len(ray.pending), ray.spec.priority) == (3, 3, 1000)


def test_a_relist_of_one_source_keeps_the_others_podgroups():
    cache = mpi_and_ray_cache()
    relist(cache, "podgroups.scheduling.x-k8s.io", [])
    relist(cache, "podgroups", [])
    assert list(cache.groups) == ["train/volcano:ray-c-pg"]
    assert cache.groups_raw["train/volcano:ray-c-pg"]["apiVersion"] == "scheduling.volcano.sh/v1beta1"


def test_a_hostile_foreign_podgroup_is_reported_and_its_gang_waits_with_the_reason():
    cache = asyncio.run(new_cache())
    reported = []
    cache.on_bad_object = lambda kind, obj, why: reported.append((kind, obj["apiVersion"], why))
    relist(cache, "podgroups.scheduling.x-k8s.io", [sp_group("pi", minMember=-4)])
    relist(cache, "podgroups.scheduling.volcano.sh", [volcano_group("ray-c-pg", minMember=2,
                                                                    priorityClassName="missing")])
    relist(cache, "pods", mpi_operator_pods("pi", 1) + kuberay_volcano_pods("c", 1))
    assert reported == [
        ("PodGroup", "scheduling.x-k8s.io/v1alpha1", "spec.minMember: Input should be greater than or equal to 0"),
        ("PodGroup", "scheduling.volcano.sh/v1beta1", "PriorityClass 'missing' not found")]
    plan = schedule_cycle(cache.snapshot(0.0), GangQueue())
    assert plan.bindings == []
    assert {k: v.reason for k, v in plan.verdicts.items()} == {
        "train/scheduler-plugins:pi": "InvalidPodGroup", "train/volcano:ray-c-pg": "InvalidPodGroup"}


def test_a_pod_claimed_by_two_sources_joins_the_first_and_the_other_gang_does_not_count_it():
    cache = asyncio.run(new_cache())
    relist(cache, "podgroups.scheduling.x-k8s.io", [sp_group("job", minMember=2)])
    relist(cache, "podgroups.scheduling.volcano.sh", [volcano_group("job", minMember=2)])
    both = pod_json("both", labels={SP_LABEL: "job"}, annotations={VOLCANO_ANNOTATION: "job"})
    relist(cache, "pods", [both, pod_json("v", annotations={VOLCANO_ANNOTATION: "job"})])
    gangs = GangIndex(cache.snapshot(0.0))
    assert [p.name for p in gangs["train/scheduler-plugins:job"].members] == ["both"]
    assert [p.name for p in gangs["train/volcano:job"].members] == ["v"]


# ---- the cycle: all or nothing, in the source's words ----------------------------------------

def test_a_foreign_gang_binds_whole_once_its_quorum_exists_and_not_before():
    cache = asyncio.run(new_cache())
    relist(cache, "nodes", [{"metadata": {"name": f"n{i}"},
                             "status": {"allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110",
                                                        "nvidia.com/gpu": "8"},
                                        "conditions": [{"type": "Ready", "status": "True"}]}} for i in range(3)])
    relist(cache, "podgroups.scheduling.volcano.sh", [volcano_group("ray-c-pg", minMember=3)])
    pods = kuberay_volcano_pods("c", 2)
    relist(cache, "pods", pods[:2])
    plan = schedule_cycle(cache.snapshot(0.0), GangQueue())
    verdict = plan.verdicts["train/volcano:ray-c-pg"]
    assert plan.bindings == [] and verdict.reason == "QuorumNotReached"
    assert verdict.message == ("2/3 members exist (pods with annotation scheduling.k8s.io/group-name=ray-c-pg "
                               "and schedulerName batchsched in train)")
    relist(cache, "pods", pods)
    plan = schedule_cycle(cache.snapshot(1.0), GangQueue())
    assert sorted(b.pod_name for b in plan.bindings) == ["c-gpu-worker-0", "c-gpu-worker-1", "c-head"]
    assert len({b.node_name for b in plan.bindings if b.pod_name != "c-head"}) == 2  # 8 GPUs each


def ray_cache(node_gpus: list[int], group: dict, pods: list[dict], head_cpu: str | None = None) -> ClusterCache:
    cache = asyncio.run(new_cache())
    relist(cache, "nodes", [{"metadata": {"name": f"n{i}"},
                             "status": {"allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110",
                                                        "nvidia.com/gpu": str(gpus)},
                                        "conditions": [{"type": "Ready", "status": "True"}]}}
                            for i, gpus in enumerate(node_gpus)])
    relist(cache, "podgroups.scheduling.volcano.sh", [group])
    if head_cpu:
        pods[0]["spec"]["containers"][0]["resources"]["requests"]["cpu"] = head_cpu
    relist(cache, "pods", pods)
    return cache


def test_min_task_member_holds_the_gang_until_each_task_has_its_members():
    group = volcano_group("ray-c-pg", minMember=2, minTaskMember={"headgroup": 1, "gpu-workers": 2})
    assert volcano.group_from_json(group).min_member == 3  # at least the tasks' sum: they are disjoint
    assert volcano.group_from_json(group).min_task_members == (("gpu-workers", 2), ("headgroup", 1))
    pods = kuberay_volcano_pods("c", 3)
    plan = schedule_cycle(ray_cache([8, 8, 8], group, pods[1:]).snapshot(0.0), GangQueue())  # no head yet
    verdict = plan.verdicts["train/volcano:ray-c-pg"]
    assert plan.bindings == [] and verdict.reason == "QuorumNotReached"
    assert verdict.message.endswith("; task headgroup has 0/1 members (minTaskMember)")
    plan = schedule_cycle(ray_cache([8, 8, 8], group, pods).snapshot(0.0), GangQueue())
    assert sorted(b.pod_name for b in plan.bindings) == ["c-gpu-worker-0", "c-gpu-worker-1", "c-gpu-worker-2",
                                                         "c-head"]


def test_a_plan_short_of_a_tasks_minimum_binds_nothing():
    # Room for the 3 workers (minMember 3 reached) but not for the head: without
    # minTaskMember the workers would bind; with it nothing does, and it says why.
    pods = kuberay_volcano_pods("c", 3)
    loose = volcano_group("ray-c-pg", minMember=3)
    plan = schedule_cycle(ray_cache([8, 8, 8], loose, pods, head_cpu="100").snapshot(0.0), GangQueue())
    assert sorted(b.pod_name for b in plan.bindings) == ["c-gpu-worker-0", "c-gpu-worker-1", "c-gpu-worker-2"]
    strict = volcano_group("ray-c-pg", minMember=3, minTaskMember={"headgroup": 1})
    plan = schedule_cycle(ray_cache([8, 8, 8], strict, kuberay_volcano_pods("c", 3), head_cpu="100")
                          .snapshot(0.0), GangQueue())
    verdict = plan.verdicts["train/volcano:ray-c-pg"]
    assert plan.bindings == [] and verdict.reason == "Unschedulable"
    assert verdict.message.startswith("Gang train/volcano:ray-c-pg needs 3 pods placed at once, 1 of them of task "
                                      "headgroup (minTaskMember); the best plan found places 0 of that task: 0/3 "
                                      "nodes are available")


def test_members_of_a_task_already_bound_count_toward_its_minimum():
    group = volcano_group("ray-c-pg", minMember=3, minTaskMember={"headgroup": 1, "gpu-workers": 2})
    pods = kuberay_volcano_pods("c", 2)
    pods[0]["spec"]["nodeName"], pods[0]["status"] = "n0", {"phase": "Running"}  # the head runs already
    cache = ray_cache([8, 8, 8], group, pods)
    gang = GangIndex(cache.snapshot(0.0))["train/volcano:ray-c-pg"]
    assert (gang.need, gang.task_need) == (2, {"gpu-workers": 2})
    assert len(schedule_cycle(cache.snapshot(0.0), GangQueue()).bindings) == 2


# ---- status in their vocabularies ---------------------------------------------------------

@pytest.mark.parametrize("phase, counters, expected", [
    ("Pending", Counters(pending=2), "Pending"),
    ("Queued", Counters(pending=3), "Pending"),
    ("Queued", Counters(bound=1, pending=2), "Unknown"),
    ("Scheduled", Counters(bound=3), "Scheduling"),
    ("Running", Counters(bound=3, running=3), "Running"),
    ("Succeeded", Counters(succeeded=3), "Finished"),
    ("Failed", Counters(failed=1, bound=2), "Failed"),
])
def test_scheduler_plugins_status_speaks_its_phases(phase, counters, expected):
    status = schedulerplugins.status(phase, counters, 3, "2024-01-01T00:00:00Z")
    assert status["phase"] == expected
    assert status["scheduleStartTime"] == "2024-01-01T00:00:00Z" and "conditions" not in status
    assert (status["running"], status["succeeded"], status["failed"]) == (
        counters.running, counters.succeeded, counters.failed)


@pytest.mark.parametrize("phase, counters, reason, expected_phase, expected_condition", [
    ("Pending", Counters(pending=2), "QuorumNotReached", "Inqueue", ("Unschedulable", "NotEnoughTasks")),
    ("Queued", Counters(pending=3), "Unschedulable", "Inqueue", ("Unschedulable", "NotEnoughResources")),
    ("Pending", Counters(pending=3), "InvalidPodGroup", "Pending", ("Unschedulable", "InvalidPodGroup")),
    ("Scheduled", Counters(bound=3), "Scheduled", "Running", ("Scheduled", "Scheduled")),
    ("Running", Counters(bound=3, running=3), "Scheduled", "Running", ("Scheduled", "Scheduled")),
    ("Succeeded", Counters(succeeded=3), "Scheduled", "Completed", ("Scheduled", "Scheduled")),
    ("Failed", Counters(failed=2, bound=1), "ScheduleTimeout", "Unknown", ("Unschedulable", "ScheduleTimeout")),
])
def test_volcano_status_speaks_its_phases_and_conditions(phase, counters, reason, expected_phase,
                                                           expected_condition):
    status = volcano.status(phase, counters, reason, "why")
    [condition] = status["conditions"]
    assert status["phase"] == expected_phase
    assert (condition["type"], condition["reason"], condition["status"]) == (*expected_condition, "True")
    assert status["running"] == counters.bound


def test_status_goes_to_a_foreign_podgroup_only_while_pods_of_ours_are_in_it():
    from batchsched.config import SchedulerConfig
    from batchsched.shell.scheduler import Scheduler, status_path

    config = SchedulerConfig(schedulerNames=["batchsched", "volcano"])
    scheduler = Scheduler(kube=None, config=config)  # type: ignore[arg-type]  # the loop ends before anything is sent
    cache = scheduler.cache
    relist(cache, "podgroups.scheduling.x-k8s.io", [sp_group("theirs", minMember=2)])
    relist(cache, "podgroups.scheduling.volcano.sh", [volcano_group("ray-c-pg", minMember=3)])
    relist(cache, "pods", mpi_operator_pods("theirs", 1, scheduler="scheduler-plugins-scheduler")
           + kuberay_volcano_pods("c", 1))

    async def scenario():
        scheduler.cycle()
        return dict(scheduler.status._pending)

    pending = asyncio.run(scenario())
    assert list(pending) == ["train/volcano:ray-c-pg"]  # "theirs" is scheduler-plugins' own scheduler's
    assert pending["train/volcano:ray-c-pg"]["phase"] == "Inqueue"
    assert pending["train/volcano:ray-c-pg"]["conditions"][0]["reason"] == "NotEnoughTasks"
    assert status_path("train/volcano:ray-c-pg") == (
        "/apis/scheduling.volcano.sh/v1beta1/namespaces/train/podgroups/ray-c-pg")
    assert status_path("train/scheduler-plugins:pi") == (
        "/apis/scheduling.x-k8s.io/v1alpha1/namespaces/train/podgroups/pi/status")
    assert status_path("train/pi") == "/apis/scheduling.batchsched.io/v1alpha1/namespaces/train/podgroups/pi/status"


def test_a_pod_naming_a_foreign_podgroup_that_is_not_there_says_which_api_it_looked_in():
    cache = asyncio.run(new_cache())
    relist(cache, "pods", kuberay_volcano_pods("c", 1))
    plan = schedule_cycle(cache.snapshot(0.0), GangQueue())
    verdict = plan.verdicts["train/volcano:ray-c-pg"]
    assert (verdict.reason, verdict.message) == ("PodGroupNotFound", (
        "PodGroup train/ray-c-pg (scheduling.volcano.sh/v1beta1, named by the pod's annotation "
        "scheduling.k8s.io/group-name=ray-c-pg) not found"))
    assert plan.bindings == []


def test_a_status_write_that_bumps_a_volcano_podgroups_generation_changes_nothing_the_core_sees():
    cache = asyncio.run(new_cache())
    relist(cache, "podgroups.scheduling.volcano.sh", [volcano_group("ray-c-pg", minMember=2)])
    held = cache.groups["train/volcano:ray-c-pg"]
    cache.drain_changes()
    written = volcano_group("ray-c-pg", minMember=2)
    written["metadata"]["generation"] = 2
    written["status"] = {"phase": "Inqueue"}
    cache._apply_group("MODIFIED", written, source="volcano")
    assert cache.groups["train/volcano:ray-c-pg"] is held
    assert cache.drain_changes() == (set(), False)


def test_a_foreign_crd_not_installed_counts_as_empty_is_logged_once_and_is_read_once_installed(
        monkeypatch, caplog):
    import logging

    from batchsched.shell import reflector as reflector_module
    from batchsched.kube.client import ApiError
    from tests.unit.cache_support import PagedList

    class InstalledLater(PagedList):
        """404 for the first looks, then the CRD is there with one PodGroup."""
        looks = 0

        async def request(self, method, path, *, query, **kwargs):
            self.looks += 1
            if self.looks <= 3:
                raise ApiError(404, "NotFound", "the server could not find the requested resource", {})
            return await super().request(method, path, query=query, **kwargs)

    monkeypatch.setattr(reflector_module, "ABSENT_RECHECK_SECONDS", 0.01)
    cache = asyncio.run(new_cache())
    kube = InstalledLater([volcano_group("ray-c-pg", minMember=2)])
    reflector = next(r for r in cache.reflectors(kube) if r.kind == "podgroups.scheduling.volcano.sh")

    async def run_until_listed() -> bool:
        task = asyncio.create_task(reflector.run())
        absent_seen = False
        for _ in range(200):
            await asyncio.sleep(0.005)
            absent_seen |= reflector.absent and reflector.synced.is_set()
            if cache.groups:
                break
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return absent_seen

    with caplog.at_level(logging.INFO):
        assert asyncio.run(run_until_listed())  # synced while absent: nothing waits for it
    assert list(cache.groups) == ["train/volcano:ray-c-pg"] and not reflector.absent
    messages = [r.getMessage() for r in caplog.records]
    assert len([m for m in messages if "are not served by the API server" in m]) == 1
    assert "podgroups.scheduling.volcano.sh: now served; listed" in messages


def test_a_kuberay_pod_left_with_another_scheduler_name_is_named_in_the_gangs_message():
    cache = asyncio.run(new_cache())
    relist(cache, "podgroups.scheduling.volcano.sh", [volcano_group("ray-c-pg", minMember=3)])
    pods = kuberay_volcano_pods("c", 2)
    pods[2]["spec"]["schedulerName"] = "default-scheduler"  # e.g. a webhook rewrote it
    relist(cache, "pods", pods)
    verdict = schedule_cycle(cache.snapshot(0.0), GangQueue()).verdicts["train/volcano:ray-c-pg"]
    assert verdict.message == (
        "2/3 members exist (pods with annotation scheduling.k8s.io/group-name=ray-c-pg and schedulerName "
        "batchsched in train); 1 pod(s) carry the gang annotation but schedulerName default-scheduler: "
        "c-gpu-worker-1; they do not count toward minMember (set schedulerName: batchsched)")


def test_a_volcano_podgroups_queue_is_the_batchsched_queue_it_is_admitted_through():
    assert volcano.group_from_json(volcano_group("g", minMember=2, queue="team-a")).queue == "team-a"
    assert volcano.group_from_json(volcano_group("g", minMember=2)).queue == ""  # the configured default


def test_a_shape_shared_by_tasks_places_the_members_each_task_needs_first():
    """Four 1-GPU members, three of task a and one of task b, minTaskMember
    a:1 b:1, on one 2-GPU node: a-0 and b-0 bind (creation order alone would
    place a-0 and a-1 and miss task b)."""
    from dataclasses import replace as changed
    from tests.unit.helpers import gang_pods, group, node, snapshot
    pods = [changed(p, task="a") for p in gang_pods("g", 3, gpu=1, created=1.0)]
    pods.append(changed(gang_pods("g", 4, gpu=1, created=2.0)[3], task="b"))
    spec = changed(group("g", min_member=2), min_task_members=(("a", 1), ("b", 1)))
    plan = schedule_cycle(snapshot([node("n", gpu=2)], pods, [spec]), GangQueue())
    assert sorted(b.pod_name for b in plan.bindings) == ["g-0", "g-3"]
