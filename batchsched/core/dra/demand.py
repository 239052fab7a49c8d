"""What a pending pod's own ResourceClaims ask of a node (``spec.resourceClaims``).

``ClusterState`` joins each pod that awaits placement with its claims: the
devices its unallocated claims request (``requests``, each with the CEL
selectors of its DeviceClass and of the request, and the claims'
``matchAttribute`` constraints), the node an allocated claim pins it to,
the allocated claims it only joins (``reserve``), and the unallocated ones
a member of its gang allocates in the same plan, which it joins on that
member's node (``follows``).  What the join cannot
read, or is still waiting for (a claim not created yet), is ``problem``:
the pod is placed nowhere and the message says why -- a claim is never
guessed at.  Placement (``core/dra/claims.py``) evaluates the demand on each
node.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PodClaim:
    """One ``spec.resourceClaims[]`` entry of a pod."""

    name: str  # the entry's name (containers refer to it)
    claim: str = ""  # the ResourceClaim: resourceClaimName, or the one status.resourceClaimStatuses names
    template: str = ""  # resourceClaimTemplateName ("" for a claim named directly)


@dataclass(frozen=True)
class RequestDemand:
    claim: str  # namespace/name of its claim
    request: str  # the request's name in the claim
    device_class: str
    count: int  # ExactCount's (0 with all_devices)
    selectors: tuple[str, ...]  # the class's, then the request's: CEL, all must select a device
    all_devices: bool = False  # allocationMode All: every device of the node they select, all free


@dataclass(frozen=True)
class AttributeDemand:
    """The devices of ``requests`` (claim, request) share one value of ``attribute``."""

    attribute: str
    requests: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class DeviceDemand:
    requests: tuple[RequestDemand, ...] = ()  # of the claims to allocate, in order
    constraints: tuple[AttributeDemand, ...] = ()
    node: str = ""  # the node an allocated claim of the pod pins it to ("": none)
    reserve: tuple[str, ...] = ()  # namespace/name of the allocated claims it joins
    allocate: tuple[str, ...] = ()  # namespace/name of the claims it allocates
    # (namespace/name, uid of the gang mate allocating it): unallocated claims
    # it joins where that pod goes, in the same plan (placement/gang.py)
    follows: tuple[tuple[str, str], ...] = ()
    problem: str = ""  # why it cannot be placed now ("" when it can)

    @property
    def count(self) -> int:
        """How many devices its ExactCount requests allocate (its All
        requests add as many as a node has that they select)."""
        return sum(r.count for r in self.requests)

    @property
    def asks_devices(self) -> bool:
        return bool(self.requests)

    @property
    def asks_all(self) -> bool:
        return any(r.all_devices for r in self.requests)
