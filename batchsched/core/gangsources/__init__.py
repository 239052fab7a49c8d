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
  (``kueue.py``).  Kueue's scheduling gate holds the pods until it admits
  the group; the gang waits for them as for any gated members.

A pod that two sources claim belongs to the first in ``PRECEDENCE``: our own
label is the one written for batchsched alone, then the native
``spec.schedulingGroup`` (Kubernetes' own API), then scheduler-plugins' label
(a label, which kubectl and selectors see), then Volcano's annotation, then
Kueue's group label (an admission grouping, which a scheduler's PodGroup
on the same pods refines).

This module only names things and reads pods; each foreign source's
PodGroup is read (and its status written) by its own module here.
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
PRECEDENCE = (OWN, NATIVE, SCHEDULER_PLUGINS, VOLCANO, KUEUE)


@dataclass(frozen=True)
class GangSource:
    name: str
    api_group: str
    version: str
    member_key: str  # the pod label or annotation naming the PodGroup (the spec field, for NATIVE)
    by_annotation: bool  # member_key is an annotation, not a label
    status_subresource: bool  # the CRD serves podgroups/status
    podgroups: bool = True  # False: no PodGroup object, the pods say all (Kueue)

    @property
    def api_version(self) -> str:
        return f"{self.api_group}/{self.version}"

    @property
    def path(self) -> str:
        """The PodGroups of every namespace."""
        return f"/apis/{self.api_version}/podgroups"

    def object_path(self, namespace: str, name: str) -> str:
        """Where its status is written: the status subresource, else the object itself."""
        return (f"/apis/{self.api_version}/namespaces/{namespace}/podgroups/{name}"
                + ("/status" if self.status_subresource else ""))

    def membership(self, group: str) -> str:
        """What makes a pod a member, in words."""
        if self.name == NATIVE:
            return f"{self.member_key}: {group}"
        return f"{'annotation' if self.by_annotation else 'label'} {self.member_key}={group}"


SOURCES: Mapping[str, GangSource] = {
    OWN: GangSource(OWN, constants.GROUP, constants.VERSION, constants.POD_GROUP_LABEL, False, True),
    NATIVE: GangSource(NATIVE, "scheduling.k8s.io", "v1beta1", "spec.schedulingGroup.podGroupName", False, True),
    SCHEDULER_PLUGINS: GangSource(SCHEDULER_PLUGINS, "scheduling.x-k8s.io", "v1alpha1",
                                  "scheduling.x-k8s.io/pod-group", False, True),
    # Volcano's CRD has no status subresource: its scheduler updates the whole object.
    VOLCANO: GangSource(VOLCANO, "scheduling.volcano.sh", "v1beta1", "scheduling.k8s.io/group-name", True, False),
    KUEUE: GangSource(KUEUE, "kueue.x-k8s.io", "v1beta2", "kueue.x-k8s.io/pod-group-name", False, False,
                      podgroups=False),
}

# Longer values cannot be an object name: such a pod is not in any gang of that source.
MAX_GROUP_NAME = 253
# Kueue's plain-pod groups state their size on every pod (kueue.py).
TOTAL_COUNT_ANNOTATION = "kueue.x-k8s.io/pod-group-total-count"
MAX_TOTAL_COUNT = 100_000  # as our PodGroup's minMember


def total_count(annotations: Mapping[str, str]) -> int:
    """A Kueue pod's stated group size; 0 when absent or not a count (digits, 1 to MAX_TOTAL_COUNT)."""
    value = annotations.get(TOTAL_COUNT_ANNOTATION)
    if not isinstance(value, str) or not value.isdigit() or len(value) > 6:
        return 0
    count = int(value)
    return count if 1 <= count <= MAX_TOTAL_COUNT else 0


def pod_group(labels: Mapping[str, str], annotations: Mapping[str, str],
              enabled: frozenset[str] = frozenset({OWN}), scheduling_group: object = "") -> tuple[str, str]:
    """(source, PodGroup name) of the first enabled source claiming the pod,
    ("", "") when none does; ``scheduling_group``: the pod's
    ``spec.schedulingGroup.podGroupName``."""
    for name in PRECEDENCE:
        if name not in enabled:
            continue
        source = SOURCES[name]
        if name == NATIVE:
            value = scheduling_group
        else:
            value = (annotations if source.by_annotation else labels).get(source.member_key)
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
