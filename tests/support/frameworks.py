"""Objects as job frameworks stamp them (facts: ../shared/research/
integrations-and-dra.md §4), so gang sources are tested on what the
frameworks really write, not on what batchsched would like them to write.

Owner references are left out: the objects that would own them (MPIJob,
RayCluster) do not exist here, and the garbage collector would delete
pods whose owner is missing."""
from __future__ import annotations

import copy
from typing import Any

SCHEDULER_PLUGINS_API = "scheduling.x-k8s.io/v1alpha1"
VOLCANO_API = "scheduling.volcano.sh/v1beta1"
SCHEDULER_PLUGINS_LABEL = "scheduling.x-k8s.io/pod-group"
VOLCANO_ANNOTATION = "scheduling.k8s.io/group-name"
IMAGE = "registry.example/train:1"


def _pod(name: str, namespace: str, scheduler: str, gpus: int, labels: dict, annotations: dict) -> dict:
    resources: dict[str, Any] = {"requests": {"cpu": "1"}, "limits": {}}
    if gpus:
        resources["limits"]["nvidia.com/gpu"] = str(gpus)
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": labels, "annotations": annotations},
            "spec": {"schedulerName": scheduler, "restartPolicy": "Never", "terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "main", "image": IMAGE, "resources": resources}]}}


def mpi_operator_job(job: str, namespace: str, workers: int, gpus: int, scheduler: str,
                     min_member: Any = None) -> tuple[dict, list[dict]]:
    """MPI Operator run with ``--gang-scheduling=<scheduler>`` (any value but
    volcano): a scheduler-plugins PodGroup named after the MPIJob, minMember
    launcher + workers, minResources their sum; the launcher and each worker
    carry the PodGroup label and the flag's value as schedulerName."""
    group = {"apiVersion": SCHEDULER_PLUGINS_API, "kind": "PodGroup",
             "metadata": {"name": job, "namespace": namespace},
             "spec": {"minMember": workers + 1 if min_member is None else min_member,
                      "minResources": {"cpu": str(workers + 1), "nvidia.com/gpu": str(workers * gpus)},
                      "scheduleTimeoutSeconds": 86400}}
    common = {SCHEDULER_PLUGINS_LABEL: job, "training.kubeflow.org/job-name": job,
              "training.kubeflow.org/operator-name": "mpi-operator"}
    pods = [_pod(f"{job}-launcher", namespace, scheduler, 0,
                 {**common, "training.kubeflow.org/job-role": "launcher"}, {})]
    pods += [_pod(f"{job}-worker-{i}", namespace, scheduler, gpus,
                  {**common, "training.kubeflow.org/job-role": "worker", "training.kubeflow.org/replica-index": str(i)},
                  {}) for i in range(workers)]
    return group, pods


def kuberay_volcano_cluster(cluster: str, namespace: str, workers: int, gpus: int, queue: str = "default",
                            min_member: Any = None) -> tuple[dict, list[dict]]:
    """KubeRay run with ``--batch-scheduler=volcano`` and a RayCluster labelled
    ``ray.io/gang-scheduling-enabled``: PodGroup ``ray-<cluster>-pg``, minMember
    head + workers; every pod has the group-name annotation, its group as
    ``volcano.sh/task-spec``, the queue label and schedulerName ``volcano``."""
    name = f"ray-{cluster}-pg"
    group = {"apiVersion": VOLCANO_API, "kind": "PodGroup", "metadata": {"name": name, "namespace": namespace},
             "spec": {"minMember": workers + 1 if min_member is None else min_member,
                      "minResources": {"cpu": str(workers + 1), "nvidia.com/gpu": str(workers * gpus)},
                      "queue": queue}}
    labels = {"ray.io/cluster": cluster, "volcano.sh/queue-name": queue}
    pods = [_pod(f"{cluster}-head", namespace, "volcano", 0,
                 {**labels, "ray.io/node-type": "head", "ray.io/group": "headgroup"},
                 {VOLCANO_ANNOTATION: name, "volcano.sh/task-spec": "headgroup"})]
    pods += [_pod(f"{cluster}-gpu-worker-{i}", namespace, "volcano", gpus,
                  {**labels, "ray.io/node-type": "worker", "ray.io/group": "gpu-workers"},
                  {VOLCANO_ANNOTATION: name, "volcano.sh/task-spec": "gpu-workers"}) for i in range(workers)]
    return group, pods


AUTO_GANG_LABEL = "scheduling.batchsched.io/auto-gang"
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
JOB_UID_LABEL = "batch.kubernetes.io/controller-uid"
JOB_INDEX = "batch.kubernetes.io/job-completion-index"


def indexed_job(name: str, namespace: str, parallelism: int, gpus: int, completions: int | None = None,
                auto_gang: str | None = "true", scheduler: str = "batchsched") -> dict:
    """An Indexed Job whose pods ask batchsched for an automatic gang (the
    template's auto-gang label; None leaves it out), for the real Job controller."""
    template = _pod("", namespace, scheduler, gpus, {AUTO_GANG_LABEL: auto_gang} if auto_gang else {}, {})
    del template["metadata"]["name"], template["metadata"]["namespace"], template["apiVersion"], template["kind"]
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "namespace": namespace},
            "spec": {"completionMode": "Indexed", "parallelism": parallelism,
                     "completions": parallelism if completions is None else completions,
                     "backoffLimit": 0, "template": template}}


def job_controller_pods(job: dict, uid: str = "job-uid") -> list[dict]:
    """The pods the Job controller creates for ``job`` (k8s.io/kubernetes
    pkg/controller/job: both label generations, the completion index as
    annotation and label, the Job as controller), one per index it starts."""
    name, namespace = job["metadata"]["name"], job["metadata"]["namespace"]
    pods = []
    for index in range(min(job["spec"]["parallelism"], job["spec"]["completions"])):
        pod = {"apiVersion": "v1", "kind": "Pod", **copy.deepcopy(job["spec"]["template"])}
        meta = pod["metadata"]
        meta.update(name=f"{name}-{index}-x{index}", namespace=namespace, uid=f"{uid}-{index}",
                    creationTimestamp="2024-01-01T00:00:00Z",
                    ownerReferences=[{"apiVersion": "batch/v1", "kind": "Job", "name": name, "uid": uid,
                                      "controller": True, "blockOwnerDeletion": True}])
        meta["labels"] = {**meta.get("labels", {}), JOB_NAME_LABEL: name, JOB_UID_LABEL: uid, "job-name": name,
                          "controller-uid": uid, JOB_INDEX: str(index)}
        meta["annotations"] = {**meta.get("annotations", {}), JOB_INDEX: str(index)}
        pod["spec"]["hostname"] = f"{name}-{index}"
        pod["status"] = {"phase": "Pending"}
        pods.append(pod)
    return pods


LWS_NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"
LWS_GROUP_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/group-index"
LWS_SIZE_ANNOTATION = "leaderworkerset.sigs.k8s.io/size"


def leader_worker_set_group(lws: str, namespace: str, group: int, size: int, gpus: int,
                            auto_gang: str | None = "true", scheduler: str = "batchsched") -> list[dict]:
    """The pods of group ``group`` of LeaderWorkerSet ``lws`` as its controller
    stamps them (sigs.k8s.io/lws: the leader from the leader StatefulSet, its
    workers from the group's worker StatefulSet): labels name, group-index,
    worker-index, group-key, the template's own; annotation size (leader +
    workers) on every pod, leader-name on the workers."""
    common = {LWS_NAME_LABEL: lws, LWS_GROUP_INDEX_LABEL: str(group),
              "leaderworkerset.sigs.k8s.io/group-key": f"{lws}-{group}-key",
              **({AUTO_GANG_LABEL: auto_gang} if auto_gang else {})}
    leader = f"{lws}-{group}"
    pods = [_pod(leader, namespace, scheduler, gpus, {**common, "leaderworkerset.sigs.k8s.io/worker-index": "0"},
                 {LWS_SIZE_ANNOTATION: str(size)})]
    pods += [_pod(f"{leader}-{w}", namespace, scheduler, gpus,
                  {**common, "leaderworkerset.sigs.k8s.io/worker-index": str(w)},
                  {LWS_SIZE_ANNOTATION: str(size), "leaderworkerset.sigs.k8s.io/leader-name": leader})
             for w in range(1, size)]
    return pods


JOBSET_API = "jobset.x-k8s.io/v1alpha2"
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
REPLICATED_JOB_LABEL = "jobset.sigs.k8s.io/replicatedjob-name"


def jobset(name: str, namespace: str, replicated: list[tuple[str, int, int, int]], in_order: bool = False,
           auto_gang: str | None = "true", scheduler: str = "batchsched") -> dict:
    """A JobSet (sigs.k8s.io/jobset v1alpha2) for its real controller:
    ``replicated`` lists (name, replicas, parallelism, GPUs per pod) of its
    replicated Jobs, each an Indexed Job whose pod template asks batchsched
    for an automatic gang (None leaves the label out)."""
    jobs = []
    for job_name, replicas, parallelism, gpus in replicated:
        template = indexed_job("", namespace, parallelism, gpus, auto_gang=auto_gang, scheduler=scheduler)
        jobs.append({"name": job_name, "replicas": replicas, "template": {"spec": template["spec"]}})
    spec: dict[str, Any] = {"replicatedJobs": jobs}
    if in_order:
        spec["startupPolicy"] = {"startupPolicyOrder": "InOrder"}
    return {"apiVersion": JOBSET_API, "kind": "JobSet", "metadata": {"name": name, "namespace": namespace},
            "spec": spec}


def jobset_controller_pods(js: dict, uid: str = "jobset-uid", only: tuple[str, ...] = ()) -> list[dict]:
    """The pods the JobSet controller's Jobs get from the Job controller
    (sigs.k8s.io/jobset pkg/controllers: Job ``<jobset>-<replicatedJob>-<index>``,
    labels and annotations jobset-name, jobset-uid, replicatedjob-name,
    replicatedjob-replicas, job-index, job-global-index, global-replicas on the
    Job and its pod template); ``only``: the replicated Jobs created so far
    (all when empty)."""
    name, namespace = js["metadata"]["name"], js["metadata"]["namespace"]
    replicated = js["spec"]["replicatedJobs"]
    total = sum(r["replicas"] for r in replicated)
    pods, global_index = [], 0
    for r in replicated:
        for index in range(r["replicas"]):
            stamp = {JOBSET_NAME_LABEL: name, "jobset.sigs.k8s.io/jobset-uid": uid, REPLICATED_JOB_LABEL: r["name"],
                     "jobset.sigs.k8s.io/replicatedjob-replicas": str(r["replicas"]),
                     "jobset.sigs.k8s.io/job-index": str(index),
                     "jobset.sigs.k8s.io/job-global-index": str(global_index),
                     "jobset.sigs.k8s.io/global-replicas": str(total)}
            global_index += 1
            if only and r["name"] not in only:
                continue
            template = copy.deepcopy(r["template"]["spec"]["template"])
            template["metadata"] = {"labels": {**template["metadata"].get("labels", {}), **stamp},
                                    "annotations": {**template["metadata"].get("annotations", {}), **stamp}}
            job = {"metadata": {"name": f"{name}-{r['name']}-{index}", "namespace": namespace},
                   "spec": {**r["template"]["spec"], "template": template}}
            pods += job_controller_pods(job, uid=f"{uid}-{r['name']}-{index}")
    return pods
