"""Kueue's plain-pod groups (docs/integrations.md): no PodGroup object; the
pods of a group carry the label ``kueue.x-k8s.io/pod-group-name`` and each
the annotation ``kueue.x-k8s.io/pod-group-total-count``, which is the gang's
minMember here as it is Kueue's count of pods to admit together.  Kueue
holds them with its scheduling gate ``kueue.x-k8s.io/admission`` until the
group is admitted, and may add the nodeSelector of the flavor it admitted
them to (or, under topology-aware scheduling, a node per pod): placement
honours both like any pod's, so batchsched then chooses only the GPUs."""
from __future__ import annotations

from typing import Sequence

from batchsched.core.gangsources import MAX_TOTAL_COUNT, TOTAL_COUNT_ANNOTATION
from batchsched.core.model import GroupSpec, PodInfo
from batchsched.core.text import clip

def group_spec(source: str, members: Sequence[PodInfo]) -> GroupSpec | str:
    """The gang's spec from its pods, or why they do not make one (they
    disagree on the count, or one states none)."""
    first = members[0]
    counts = sorted({p.group_total for p in members})
    if counts[0] == 0:
        bad = next(p for p in members if not p.group_total)
        return (f"pod {clip(bad.name, 253)} of Kueue pod group {clip(first.group, 253)} has no valid "
                f"{TOTAL_COUNT_ANNOTATION} annotation (a count from 1 to {MAX_TOTAL_COUNT})")
    if len(counts) > 1:
        return (f"the pods of Kueue pod group {clip(first.group, 253)} disagree on {TOTAL_COUNT_ANNOTATION}: "
                + ", ".join(str(c) for c in counts[:5]))
    return GroupSpec(namespace=first.namespace, name=first.group, min_member=counts[0],
                     created=min(p.created for p in members), source=source)
