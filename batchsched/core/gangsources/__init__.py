"""Gang sources: the conventions by which job frameworks put pods into gangs
(docs/integrations.md), read into the core's one notion of a gang.

* ``batchsched``: our PodGroup (``scheduling.batchsched.io/v1alpha1``), pod
  label ``scheduling.batchsched.io/pod-group``; always on.
* ``kubernetes``: the native gang API (v1.37, gate ``GenericWorkload``):
  PodGroup ``scheduling.k8s.io/v1beta1`` with ``schedulingPolicy.gang.minCount``,
  pods joining through ``spec.schedulingGroup.podGroupName`` (``native.py``).
* ``scheduler-plugins``: PodGroup ``scheduling.x-k8s.io/v1alpha1``, pod label
  ``scheduling.x-k8s.io/pod-group`` (MPI Operator, Trainer's coscheduling
  plugin, KubeRay).
* ``volcano``: PodGroup ``scheduling.volcano.sh/v1beta1``, pod annotation
  ``scheduling.k8s.io/group-name`` (KubeRay, Trainer, Spark, MPI Operator).
* ``kueue``: Kueue's plain-pod groups, no PodGroup object: pod label
  ``kueue.x-k8s.io/pod-group-name``, and every pod's annotation
  ``kueue.x-k8s.io/pod-group-total-count`` is the gang's minMember
  (``stated_size.py``).  Kueue's scheduling gate holds the pods until it
  admits the group; the gang waits for them as for any gated members.
* ``leaderworkerset``: an automatic gang, no PodGroup object: the leader and
  workers of one LeaderWorkerSet group (labels
  ``leaderworkerset.sigs.k8s.io/name`` and ``group-index``), minMember their
  annotation ``leaderworkerset.sigs.k8s.io/size`` (``stated_size.py``).
* ``jobset``: an automatic gang, no PodGroup object: the pods of one JobSet
  (label ``jobset.sigs.k8s.io/jobset-name``), its size read from the JobSet
  (the sum over its replicated Jobs of replicas x pods each runs at once);
  a JobSet that starts its replicated Jobs in turn (``startupPolicyOrder:
  InOrder`` or ``dependsOn``) is a gang of the stages started (``jobsets.py``).
* ``job``: an automatic gang, no PodGroup object: the pods of one indexed
  Job (label ``batch.kubernetes.io/job-name``, annotation
  ``batch.kubernetes.io/job-completion-index``), its size read from the Job
  itself (``jobs.py``).
  Automatic gangs are opt-in: per owner by the pod template's label
  ``scheduling.batchsched.io/auto-gang: "true"``, or for every owner of the
  kind by config.

A pod that two sources claim belongs to the first in ``PRECEDENCE``: our own
label is the one written for batchsched alone, then the native
``spec.schedulingGroup`` (Kubernetes' own API), then scheduler-plugins' label
(a label, which kubectl and selectors see), then Volcano's annotation, then
Kueue's group label (an admission grouping, which a scheduler's PodGroup
on the same pods refines), then the automatic gangs: they come from who
made the pods, which says least about what the user asked, so any explicit
grouping on the same pods wins.  Among them the JobSet comes before the Job:
a JobSet's pods are also its Jobs' pods, and the JobSet is the whole job.

This module only names things and reads pods; each source's objects are
read (and its PodGroup's status written) by its own module here, whose
plugin (``plugin.py``: reader, status writer, RBAC needs) is one line of
``registry.py``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from batchsched.api import constants

OWN = "batchsched"
NATIVE = "kubernetes"
SCHEDULER_PLUGINS = "scheduler-plugins"
VOLCANO = "volcano"
KUEUE = "kueue"
LEADER_WORKER_SET = "leaderworkerset"
JOBSET = "jobset"
JOB = "job"
PRECEDENCE = (OWN, NATIVE, SCHEDULER_PLUGINS, VOLCANO, KUEUE, LEADER_WORKER_SET, JOBSET, JOB)
# Automatic gangs: formed from the pods' owner, not from an object made to group them.
AUTOMATIC = frozenset({LEADER_WORKER_SET, JOBSET, JOB})
# Automatic gangs sized by their owner object, read by a watch of the owners' collection.
OWNER_SIZED = (JOBSET, JOB)

# A pod's role in a Volcano gang, which its PodGroup's minTaskMember counts by.
VOLCANO_TASK_ANNOTATION = "volcano.sh/task-spec"


@dataclass(frozen=True)
class GangSource:
    name: str
    api_group: str
    version: str
    member_key: str  # the pod label or annotation naming the PodGroup (the spec field, for NATIVE)
    by_annotation: bool  # member_key is an annotation, not a label
    status_subresource: bool  # the CRD serves podgroups/status
    podgroups: bool = True  # False: no PodGroup object (Kueue: the pods say all; Job: its owner does)
    plural: str = "podgroups"  # the collection that sizes the gang
    kind: str = "PodGroup"
    # Set: the gang is the owner's name (member_key), "-", this label's value (a LeaderWorkerSet's group).
    index_label: str = ""
    # Set: every pod states the gang's size in this annotation (stated_size.py), as in a ``group_words``.
    size_annotation: str = ""
    group_words: str = ""
    # Set: the pod annotation naming its role in the gang (Volcano's task), which minTaskMember counts by.
    task_annotation: str = ""

    @property
    def api_version(self) -> str:
        return f"{self.api_group}/{self.version}"

    @property
    def path(self) -> str:
        """The objects of every namespace that size the gangs (PodGroups, or Jobs)."""
        return f"/apis/{self.api_version}/{self.plural}"

    def object_path(self, namespace: str, name: str) -> str:
        """Where its status is written: the status subresource, else the object itself."""
        return (f"/apis/{self.api_version}/namespaces/{namespace}/podgroups/{name}"
                + ("/status" if self.status_subresource else ""))

    def membership(self, group: str) -> str:
        """What makes a pod a member, in words."""
        if self.name == NATIVE:
            return f"{self.member_key}: {group}"
        if self.index_label:
            return f"labels {self.member_key} and {self.index_label} of group {group}"
        return f"{'annotation' if self.by_annotation else 'label'} {self.member_key}={group}"


SOURCES: Mapping[str, GangSource] = {
    OWN: GangSource(OWN, constants.GROUP, constants.VERSION, constants.POD_GROUP_LABEL, False, True),
    NATIVE: GangSource(NATIVE, "scheduling.k8s.io", "v1beta1", "spec.schedulingGroup.podGroupName", False, True),
    SCHEDULER_PLUGINS: GangSource(SCHEDULER_PLUGINS, "scheduling.x-k8s.io", "v1alpha1",
                                  "scheduling.x-k8s.io/pod-group", False, True),
    # Volcano's CRD has no status subresource: its scheduler updates the whole object.
    VOLCANO: GangSource(VOLCANO, "scheduling.volcano.sh", "v1beta1", "scheduling.k8s.io/group-name", True, False,
                        task_annotation=VOLCANO_TASK_ANNOTATION),
    KUEUE: GangSource(KUEUE, "kueue.x-k8s.io", "v1beta2", "kueue.x-k8s.io/pod-group-name", False, False,
                      podgroups=False, size_annotation="kueue.x-k8s.io/pod-group-total-count",
                      group_words="Kueue pod group"),
    LEADER_WORKER_SET: GangSource(LEADER_WORKER_SET, "leaderworkerset.x-k8s.io", "v1",
                                  "leaderworkerset.sigs.k8s.io/name", False, False, podgroups=False,
                                  plural="leaderworkersets", kind="LeaderWorkerSet",
                                  index_label="leaderworkerset.sigs.k8s.io/group-index",
                                  size_annotation="leaderworkerset.sigs.k8s.io/size",
                                  group_words="LeaderWorkerSet group"),
    # The JobSet controller's label (on its Jobs and their pods); its status is the JobSet controller's.
    JOBSET: GangSource(JOBSET, "jobset.x-k8s.io", "v1alpha2", "jobset.sigs.k8s.io/jobset-name", False, False,
                       podgroups=False, plural="jobsets", kind="JobSet"),
    # The Job controller's label; a Job has no status of ours to write.
    JOB: GangSource(JOB, "batch", "v1", "batch.kubernetes.io/job-name", False, False, podgroups=False,
                    plural="jobs", kind="Job"),
}

# Longer values cannot be an object name: such a pod is not in any gang of that source.
MAX_GROUP_NAME = 253
# The most pods a gang states on its pods (stated_size.py), as our PodGroup's minMember.
MAX_TOTAL_COUNT = 100_000
# The Job controller writes it on the pods of Indexed Jobs only: a NonIndexed
# Job's pods are interchangeable and each may run alone.
JOB_INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"
# On a pod (its owner's template): "true" asks an automatic gang, "false" refuses one.
AUTO_GANG_LABEL = f"{constants.GROUP}/auto-gang"


def stated_count(source: str, annotations: Mapping[str, str]) -> int:
    """The gang size a pod states for ``source`` (Kueue's, a LeaderWorkerSet's);
    0 when it states none or not a count (digits, 1 to MAX_TOTAL_COUNT)."""
    if not SOURCES[source].size_annotation:
        return 0
    value = annotations.get(SOURCES[source].size_annotation)
    if not isinstance(value, str) or not value.isdigit() or len(value) > 6:
        return 0
    count = int(value)
    return count if 1 <= count <= MAX_TOTAL_COUNT else 0


def stated_task(source: str, annotations: Mapping[str, str]) -> str:
    """The pod's role in its gang, where its source names one (Volcano's
    task); "" when it names none or not a usable one."""
    key = SOURCES[source].task_annotation
    task = annotations.get(key) if key else None
    return task if isinstance(task, str) and len(task) <= MAX_GROUP_NAME else ""


def auto_gang_wanted(source: str, labels: Mapping[str, str], annotations: Mapping[str, str],
                     always: frozenset[str]) -> bool:
    """Whether the pod joins its owner's automatic gang: its owner is of the
    kind (an indexed Job), and it asks for one, or the config makes every such
    owner a gang (``always``) and it does not refuse."""
    if source == JOB and JOB_INDEX_ANNOTATION not in annotations:
        return False
    wanted = labels.get(AUTO_GANG_LABEL)
    return wanted == "true" or (source in always and wanted != "false")


def pod_group(labels: Mapping[str, str], annotations: Mapping[str, str],
              enabled: frozenset[str] = frozenset({OWN}), auto_always: frozenset[str] = frozenset(),
              scheduling_group: object = "") -> tuple[str, str]:
    """(source, PodGroup name) of the first enabled source claiming the pod,
    ("", "") when none does.  ``auto_always``: the automatic sources every
    owner of whose kind is a gang (else only those whose pods ask);
    ``scheduling_group``: the pod's ``spec.schedulingGroup.podGroupName``."""
    for name in PRECEDENCE:
        if name not in enabled:
            continue
        if name in AUTOMATIC and not auto_gang_wanted(name, labels, annotations, auto_always):
            continue
        source = SOURCES[name]
        if name == NATIVE:
            value = scheduling_group
        else:
            value = (annotations if source.by_annotation else labels).get(source.member_key)
        if source.index_label:
            index = labels.get(source.index_label)
            value = f"{value}-{index}" if value and isinstance(index, str) and index.isdigit() else None
        if isinstance(value, str) and value and len(value) <= MAX_GROUP_NAME:
            return name, value
    return "", ""


def gang_key(namespace: str, source: str, group: str) -> str:
    """Our PodGroups keep ``namespace/name``; a foreign one is
    ``namespace/source:name`` (":" is in no object name, so none collide)."""
    return f"{namespace}/{group}" if source in ("", OWN) else f"{namespace}/{source}:{group}"


def source_of_key(key: str) -> str:
    """The source of a PodGroup's gang key (see gang_key)."""
    name = key.partition("/")[2]
    prefix, colon, _ = name.partition(":")
    return prefix if colon and prefix in SOURCES else OWN
