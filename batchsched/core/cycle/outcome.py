"""What a cycle decides: bindings, verdicts, evictions, nominations and
resets (``CyclePlan``), and the reasons a verdict gives."""
from __future__ import annotations

from dataclasses import dataclass, field

from batchsched.core.dra.claims import ClaimAllocation
from batchsched.core.dra.extended import ExtendedClaim
from batchsched.core.dra.model import AllocatedDevice
from batchsched.core.dra.state import EXTENDED_CLAIM
from batchsched.core.model import PodInfo
from batchsched.core.queueing.queue import Reservation

REASON_SCHEDULED = "Scheduled"
REASON_UNSCHEDULABLE = "Unschedulable"
REASON_EXCEEDS_CAPACITY = "ExceedsClusterCapacity"  # could not fit even on empty nodes
REASON_QUORUM_NOT_REACHED = "QuorumNotReached"
# Enough members exist, but some wait for their ResourceClaims (made, allocatable).
REASON_CLAIMS_NOT_READY = "ResourceClaimsNotReady"
REASON_SCHEDULE_TIMEOUT = "ScheduleTimeout"
REASON_PARTIAL_TIMEOUT = "PartialGangTimeout"
REASON_INTERNAL_ERROR = "InternalError"  # trying the gang raised; see its message
# PodGroupNotFound and InvalidPodGroup come from batchsched.core.gangs.


@dataclass(frozen=True)
class Binding:
    pod_uid: str
    namespace: str
    pod_name: str
    node_name: str
    gang_key: str
    gpu_ids: tuple[int, ...] = ()  # travel on the Binding as the gpu-ids annotation
    # Where DRA serves nvidia.com/gpu: the claim to write (allocated and
    # reserved) before binding (shell/claims.py)
    claim: ExtendedClaim | None = None
    # The pod's own ResourceClaims, allocated or reserved before binding
    claims: tuple[ClaimAllocation, ...] = ()

    @property
    def allocations(self) -> dict[str, tuple[AllocatedDevice, ...]]:
        """The devices each claim is given (by claim uid; the extended-resource
        claim, not made yet, as ``EXTENDED_CLAIM``): in flight from the decision on."""
        given = {EXTENDED_CLAIM: self.claim.devices} if self.claim is not None else {}
        given.update((c.uid, c.devices) for c in self.claims if c.devices)
        return given


@dataclass(frozen=True)
class Verdict:
    scheduled: bool  # the gang's quorum is placed (now or before)
    reason: str
    message: str


@dataclass(frozen=True)
class Eviction:
    pod: PodInfo
    preemptor: str  # gang key
    reclaim: bool = False  # for the preemptor's queue taking back room it lent, not by priority


@dataclass(frozen=True)
class Nomination:
    pod: PodInfo
    node_name: str


@dataclass(frozen=True)
class GangReset:
    """A gang left partly bound too long: evict its bound members so it starts over."""

    gang_key: str
    pods: tuple[PodInfo, ...]
    message: str


@dataclass(frozen=True)
class CyclePlan:
    bindings: list[Binding] = field(default_factory=list)
    verdicts: dict[str, Verdict] = field(default_factory=dict)
    evictions: list[Eviction] = field(default_factory=list)
    nominations: list[Nomination] = field(default_factory=list)
    resets: list[GangReset] = field(default_factory=list)
    reservation: Reservation | None = None  # the queue's once the cycle is done
