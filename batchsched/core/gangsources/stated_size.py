"""Gangs whose pods state their own size, with no object to read it from
(docs/integrations.md): every pod carries the size in its source's
``size_annotation``, and the pods of a gang must agree on it.

* Kueue's plain-pod groups: label ``kueue.x-k8s.io/pod-group-name``,
  annotation ``kueue.x-k8s.io/pod-group-total-count``, which is Kueue's count
  of pods to admit together.  Kueue holds them with its scheduling gate
  ``kueue.x-k8s.io/admission`` until the group is admitted, and may add the
  nodeSelector of the flavor it admitted them to (or, under topology-aware
  scheduling, a node per pod): placement honours both like any pod's, so
  batchsched then chooses only the GPUs.
* LeaderWorkerSet groups (an automatic gang): the leader and workers of one
  group carry the labels ``leaderworkerset.sigs.k8s.io/name`` and
  ``group-index`` and the annotation ``leaderworkerset.sigs.k8s.io/size``
  (leader + workers), which the LWS controller writes on every pod."""
from __future__ import annotations

from typing import Sequence

from batchsched.core.gangsources import KUEUE, LEADER_WORKER_SET, MAX_TOTAL_COUNT, SOURCES
from batchsched.core.gangsources.plugin import SourcePlugin
from batchsched.core.model import GroupSpec, PodInfo
from batchsched.core.text import clip


def group_spec(source: str, members: Sequence[PodInfo]) -> GroupSpec | str:
    """The gang's spec from its pods, or why they do not make one (they
    disagree on the size, or one states none)."""
    first, stated = members[0], SOURCES[source]
    counts = sorted({p.group_total for p in members})
    if counts[0] == 0:
        bad = next(p for p in members if not p.group_total)
        return (f"pod {clip(bad.name, 253)} of {stated.group_words} {clip(first.group, 253)} has no valid "
                f"{stated.size_annotation} annotation (a count from 1 to {MAX_TOTAL_COUNT})")
    if len(counts) > 1:
        return (f"the pods of {stated.group_words} {clip(first.group, 253)} disagree on {stated.size_annotation}: "
                + ", ".join(str(c) for c in counts[:5]))
    return GroupSpec(namespace=first.namespace, name=first.group, min_member=counts[0],
                     created=min(p.created for p in members), source=source)


# No object to read or write: the pods say all.
KUEUE_PLUGIN = SourcePlugin(SOURCES[KUEUE])
LEADER_WORKER_SET_PLUGIN = SourcePlugin(SOURCES[LEADER_WORKER_SET])
