"""The gang queue: order, backoff, schedule timeouts and the reservation.

Order
    A gang partially bound by this scheduler (quorum not yet complete, e.g.
    after a binding failed mid-gang) comes first (``ahead``), so its
    remainder is placed before anyone takes the room; members nobody proves
    bound by it (a pod created with spec.nodeName; core/gangs.py
    ``bound_by_us``) give no such precedence.
    Then gangs by priority (highest first), creation time (oldest first) and
    key (the criteria of ``queueing/order.py``, in its table).  Every gang whose backoff has expired is tried, in this order, so a
    gang that does not fit never blocks the gangs behind it.

Attempts per cycle (``attempts``)
    At most ``max_gangs_per_cycle`` gangs are tried in one cycle.  A *pass*
    goes over the queue in order and may span cycles: when the budget runs
    out, the next cycle resumes after the last gang tried, and a gang ahead
    of that point which this pass already tried waits for the next pass
    (gangs new to the pass are still tried first, in order).  So each gang
    is tried at most once per pass, and a ready gang is tried within the
    cycles two passes take: at most ``2 * ceil(N / max_gangs_per_cycle) + 1``
    with N gangs in the queue.

Backoff
    After a failed attempt a gang waits ``initial_backoff`` seconds, doubling
    with each further failure up to ``max_backoff``.  The backoff is cleared
    when the gang is placed, when its membership or spec changes (``touch``,
    also detected by ``sync`` from the gang's signature), and when capacity
    frees up (``capacity_freed``) for the gangs the freed capacity may help:
    ``retry_if_freed`` asks the cycle, which knows the nodes and the gangs'
    pods.  A gang so woken whose room others took before its turn goes back
    to its backoff untried (``woken_by_freed``, ``resume_backoff``).

    A binding the API refused (an admission webhook, a quota) backs the gang
    off on its own clock (``record_bind_refused``), doubling the same way;
    neither freed capacity nor a change to the gang clears it (it was not
    for want of room, and the gang's own pods change as they start), only a
    binding of the gang that goes through.  It is kept by gang, not by
    queue entry: a gang leaves the queue while its bindings are in flight.

Partial gangs
    The queue notes since when each gang has been partially bound, whoever
    bound its members (``partial_expired``): one that stays so for the
    configured timeout is started over by the cycle
    (batchsched.core.cycle).  The clock, too, is
    kept by gang and survives the gang's leaving the queue while bindings
    are in flight; it stops when the queue sees the gang whole or unbound,
    or a binding of it goes through.

Schedule timeout
    A gang's waiting clock starts when it enters the queue (it is eligible:
    quorum exists) or at a time the shell supplies (``set_waiting_since``).
    A gang that times out is skipped until ``touch``ed, which restarts its clock.

Anti-starvation reservation
    Because smaller gangs keep slipping into capacity as it frees up, a large
    gang could wait forever.  So the first gang in queue order that has waited
    longer than ``reservation_after_seconds``, has not timed out, is not
    hopeless and has not outlasted a reservation gets one: it is planned
    against node allocatable minus the pods it cannot expect to finish for
    it -- pods that are not ours, pods of gangs with a higher priority, its
    own bound members, pods that never end by themselves
    (``PodInfo.runs_to_completion``) -- as if our other pods of lower or
    equal priority had all finished (among nodes equally good then, those
    freest now).  The nodes of that plan are
    off-limits to every gang ordered after it until it is placed or leaves
    the queue; gangs ordered before it are unaffected.  A gang that does not
    fit even then is *hopeless*: it never holds a reservation, so it cannot
    starve anyone; the check is repeated after ``touch`` or after
    ``capacity_freed`` that may help it (``retry_if_freed``).  A gang that holds the reservation longer than
    ``max_reservation_seconds``, or past the deadlines of every pod it waits
    for, loses it and is marked ``reservation_expired`` until ``touch``ed
    (``reserve``).  The reservation is recomputed every cycle by
    ``batchsched.core.cycle``; the queue holds the result and enforces it,
    except against gangs that backfill: the cycle lets a gang whose pods all
    end (by their runtime bounds, batchsched.core.queueing.runtime) before
    the reserved gang is expected to fit use the reserved nodes meanwhile.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Hashable, Iterable, Iterator

from sortedcontainers import SortedList

from batchsched.core.queueing.order import order_key

if TYPE_CHECKING:
    from batchsched.core.config import CoreConfig
    from batchsched.core.gangs import Gang


@dataclass
class _Entry:
    key: str
    priority: int
    created: float
    signature: Hashable
    waiting_since: float | None  # None: restart the clock at the next sync
    partial: bool = False  # some members bound, quorum incomplete: the start-over clock runs
    ahead: bool = False  # partial, and some of those members bound by us: first in line
    failures: int = 0
    retry_at: float = 0.0
    timed_out: bool = False
    hopeless: bool = False
    reservation_expired: bool = False  # held one past its bound; none until touched
    tried_in_pass: int = -1  # the last pass (GangQueue._pass) that tried it
    # Where it sorts (queueing/order.py; the gang key last): kept, as it is read
    # for every gang tried (reserved_against) and changes only in ``upsert``.
    order: tuple = field(init=False, default=())

    def __post_init__(self) -> None:
        self.order = order_key(self)


@dataclass(frozen=True)
class Reservation:
    gang_key: str
    nodes: frozenset[str]
    since: float = field(default=0.0, compare=False)  # when this gang first got it
    # When the gang is expected to fit on ``nodes``, from the runtime bounds
    # of the pods it waits for there; None: one has none (no backfill then)
    ready_at: float | None = field(default=None, compare=False)


class GangQueue:
    def __init__(self, initial_backoff: float = 1.0, max_backoff: float = 60.0,
                 reservation_after_seconds: float = 60.0, max_reservation_seconds: float = 14400.0):
        self.initial_backoff = initial_backoff
        self.max_backoff = max_backoff
        self.reservation_after_seconds = reservation_after_seconds
        self.max_reservation_seconds = max_reservation_seconds
        self._entries: dict[str, _Entry] = {}
        self._order: SortedList = SortedList()  # of _Entry.order
        self._waiting_hints: dict[str, float] = {}
        self._reservation: Reservation | None = None
        self._partial_since: dict[str, float] = {}  # gang key -> partially bound since
        self._bind_refusals: dict[str, tuple[int, float]] = {}  # gang key -> (refusals in a row, retry at)
        # gang key -> why it was started over; kept until it is placed again
        # (or forgotten), so its verdict keeps saying so while its pods return
        self.started_over: dict[str, str] = {}
        self._pass = 0  # the current pass over the queue (``attempts``)
        self._paused_at: float | None = None  # when the budget cut the current pass short
        self._freed = False  # capacity freed since the last ``retry_if_freed``
        # gang key -> (failures, retry at) before ``retry_if_freed`` ended its
        # backoff, until it is tried (or touched, or leaves)
        self._woken: dict[str, tuple[int, float]] = {}

    @classmethod
    def from_config(cls, config: CoreConfig) -> GangQueue:
        return cls(config.initial_backoff, config.max_backoff, config.reservation_after_seconds,
                   config.max_reservation_seconds)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def depth_by_priority(self) -> dict[int, int]:
        """How many gangs wait, per priority (for the queue-depth metric)."""
        depth: dict[int, int] = {}
        for entry in self._entries.values():
            depth[entry.priority] = depth.get(entry.priority, 0) + 1
        return depth

    # -- membership -------------------------------------------------------

    def sync(self, gangs: Iterable[Gang], now: float) -> None:
        """Make the queue hold exactly ``gangs`` (the eligible ones with pending pods)."""
        present = set()
        for gang in gangs:
            self.upsert(gang.key, gang.priority, gang.created, now, gang.signature,
                        partial=gang.partly_bound, ahead=gang.first_in_line)
            present.add(gang.key)
        for key in [k for k in self._entries if k not in present]:
            self.remove(key)
        self._waiting_hints = {k: v for k, v in self._waiting_hints.items() if k in present}

    def upsert(self, key: str, priority: int, created: float, now: float,
               signature: Hashable = None, partial: bool = False, ahead: bool = False) -> None:
        entry = self._entries.get(key)
        if entry is None:
            since = min(now, self._waiting_hints.pop(key, now))
            entry = self._entries[key] = _Entry(key, priority, created, signature, since, partial=partial,
                                                ahead=ahead)
            self._order.add(entry.order)
            self._note_partial(entry, now)
            return
        entry.partial = partial
        if (priority, created, ahead) != (entry.priority, entry.created, entry.ahead):
            self._order.remove(entry.order)
            entry.priority, entry.created, entry.ahead = priority, created, ahead
            entry.order = order_key(entry)
            self._order.add(entry.order)
        if signature != entry.signature:
            entry.signature = signature
            self.touch(key)
        if entry.waiting_since is None:
            entry.waiting_since = now
        self._note_partial(entry, now)

    def _note_partial(self, entry: _Entry, now: float) -> None:
        if entry.partial:
            self._partial_since.setdefault(entry.key, now)
        else:
            self._partial_since.pop(entry.key, None)

    def remove(self, key: str) -> None:
        entry = self._entries.pop(key, None)
        self._woken.pop(key, None)
        if entry is not None:
            self._order.remove(entry.order)
            self._release_if_held_by(key)

    def ordered(self) -> Iterator[str]:
        """Gang keys, first to be tried first."""
        for order in list(self._order):
            yield order[-1]

    # -- events from the shell ----------------------------------------------

    def note_changes(self, touched: Iterable[str], capacity_freed: bool) -> None:
        """What changed in the cluster since the last cycle, as a watch cache
        records it: the gangs whose pods or PodGroup changed, and whether
        capacity was freed.  Called once before each cycle, by the shell and
        by the simulator alike."""
        for key in touched:
            self.touch(key)
        if capacity_freed:
            self.capacity_freed()

    def touch(self, gang_key: str) -> None:
        """The gang's membership or spec changed: retry it at once.

        Clears its backoff, hopeless and reservation-expired marks; a
        timed-out gang is attempted again with its waiting clock restarted
        at the next cycle.
        """
        entry = self._entries.get(gang_key)
        if entry is None:
            return
        self._woken.pop(gang_key, None)
        entry.failures = 0
        entry.retry_at = 0.0
        entry.hopeless = False
        entry.reservation_expired = False
        if entry.timed_out:
            entry.timed_out = False
            entry.waiting_since = None

    def capacity_freed(self) -> None:
        """Pods ended or nodes came: the next ``retry_if_freed`` retries the
        gangs it may help."""
        self._freed = True

    def retry_if_freed(self, may_fit: Callable[[str], bool], may_fit_drained: Callable[[str], bool]) -> None:
        """If capacity was freed since the last call, end the backoff of each
        backing-off gang that ``may_fit`` and the hopeless mark of each one
        that ``may_fit_drained`` (as the reservation plans it); the others
        keep theirs, so churn that cannot help them does not make them use
        up a cycle's attempts or its reservation check."""
        if not self._freed:
            return
        self._freed = False
        for entry in self._entries.values():
            if entry.retry_at and may_fit(entry.key):
                self._woken[entry.key] = (entry.failures, entry.retry_at)
                entry.failures = 0
                entry.retry_at = 0.0
            if entry.hopeless and may_fit_drained(entry.key):
                entry.hopeless = False

    def woken_by_freed(self, gang_key: str, now: float) -> bool:
        """Whether it is ready only because ``retry_if_freed`` ended its
        backoff (not tried since, and that backoff would still run)."""
        woken = self._woken.get(gang_key)
        return woken is not None and woken[1] > now

    def resume_backoff(self, gang_key: str) -> None:
        """Undo what ``retry_if_freed`` did for it: the room freed was
        taken before its turn, so its backoff goes on as before."""
        woken = self._woken.pop(gang_key, None)
        entry = self._entries.get(gang_key)
        if woken is not None and entry is not None:
            entry.failures, entry.retry_at = woken

    def set_waiting_since(self, gang_key: str, since: float) -> None:
        """The gang has been waiting since ``since`` (e.g. from PodGroup
        status after a restart); takes effect when it enters the queue."""
        entry = self._entries.get(gang_key)
        if entry is None:
            self._waiting_hints[gang_key] = since
        elif entry.waiting_since is None or since < entry.waiting_since:
            entry.waiting_since = since

    # -- attempts ---------------------------------------------------------

    def attempts(self, now: float, budget: int) -> Iterator[str]:
        """The gangs to try in this cycle, in order: those ready, at most
        ``budget`` of them, going on with the current pass (module
        docstring).  Consume it whole; each key yielded counts as tried."""
        current = self._pass
        tried, skipped = 0, False
        for order in list(self._order):
            entry = self._entries.get(order[-1])
            if entry is None or not self.ready(entry.key, now):
                continue
            if entry.tried_in_pass == current:
                skipped = True  # tried in this pass already: its turn comes in the next
                continue
            if tried == budget:
                self._paused_at = now
                return
            entry.tried_in_pass = current
            tried += 1
            yield entry.key
        # The pass is over; gangs it skipped are ready for the next at once.
        self._pass, self._paused_at = current + 1, now if skipped else None

    def ready(self, gang_key: str, now: float) -> bool:
        entry = self._entries.get(gang_key)
        return (entry is not None and not entry.timed_out and now >= entry.retry_at
                and now >= self._bind_refusals.get(gang_key, (0, 0.0))[1])

    def record_failure(self, gang_key: str, now: float) -> float:
        """Back the gang off; returns the backoff in seconds."""
        entry = self._entries[gang_key]
        self._woken.pop(gang_key, None)
        entry.failures += 1
        delay = min(self.initial_backoff * 2 ** (entry.failures - 1), self.max_backoff)
        entry.retry_at = now + delay
        return delay

    def record_bind_refused(self, gang_key: str, now: float) -> None:
        """The API refused a binding of the gang: back it off on its own clock."""
        refusals = self._bind_refusals.get(gang_key, (0, 0.0))[0] + 1
        self._bind_refusals[gang_key] = (refusals, now + min(self.initial_backoff * 2 ** (refusals - 1),
                                                             self.max_backoff))

    def record_bound(self, gang_key: str) -> None:
        """A binding of the gang went through: refusals are behind it, and
        so is any partial state it was in (the queue sees it anew)."""
        self._bind_refusals.pop(gang_key, None)
        self._partial_since.pop(gang_key, None)

    def partial_expired(self, now: float, timeout: float) -> list[str]:
        """Gangs partially bound for longer than ``timeout``, in key order;
        their clocks restart (a start-over is not repeated every cycle)."""
        expired = sorted(k for k, since in self._partial_since.items()
                         if now - since > timeout and k in self._entries)
        for key in expired:
            self._partial_since[key] = now
        return expired

    def forget(self, gang_key: str) -> None:
        """The gang is gone for good."""
        self.remove(gang_key)
        self.started_over.pop(gang_key, None)
        self._partial_since.pop(gang_key, None)
        self._bind_refusals.pop(gang_key, None)

    def record_success(self, gang_key: str) -> None:
        self.started_over.pop(gang_key, None)
        self._woken.pop(gang_key, None)
        entry = self._entries.get(gang_key)
        if entry is not None:
            entry.failures = 0
            entry.retry_at = 0.0
        self._release_if_held_by(gang_key)

    def next_retry_at(self) -> float | None:
        """When the earliest backed-off gang becomes ready, or at once when
        the budget cut the last pass short (for the shell's next wake-up);
        None when no gang waits for either."""
        times = [max(e.retry_at, self._bind_refusals.get(e.key, (0, 0.0))[1]) for e in self._entries.values()
                 if (e.retry_at or e.key in self._bind_refusals) and not e.timed_out]
        if self._paused_at is not None:
            times.append(self._paused_at)
        return min(times, default=None)

    # -- schedule timeout ---------------------------------------------------

    def waited(self, gang_key: str, now: float) -> float:
        since = self._entries[gang_key].waiting_since
        return 0.0 if since is None else now - since

    def time_out(self, gang_key: str) -> None:
        self._entries[gang_key].timed_out = True
        self._release_if_held_by(gang_key)

    def timed_out(self, gang_key: str) -> bool:
        entry = self._entries.get(gang_key)
        return entry is not None and entry.timed_out

    # -- reservation --------------------------------------------------------

    @property
    def reservation(self) -> Reservation | None:
        return self._reservation

    def reservation_candidates(self, now: float) -> Iterator[str]:
        """Gangs, in order, that have waited long enough for a reservation."""
        for key in self.ordered():
            entry = self._entries[key]
            if (not entry.timed_out and not entry.hopeless and not entry.reservation_expired
                    and key not in self._bind_refusals  # it could not use the nodes: the API refuses it
                    and entry.waiting_since is not None
                    and now - entry.waiting_since > self.reservation_after_seconds):
                yield key

    def mark_hopeless(self, gang_key: str) -> None:
        """It does not fit even without our lower-priority pods."""
        self._entries[gang_key].hopeless = True
        self._release_if_held_by(gang_key)

    def reserve(self, gang_key: str, nodes: Iterable[str], now: float, awaited_end: float | None = None,
                ready_at: float | None = None) -> bool:
        """Reserve ``nodes`` for ``gang_key`` (expected to fit there at
        ``ready_at``), unless it has held the reservation past its bound:
        ``max_reservation_seconds`` since it got it, or ``awaited_end``, when
        the pods it waits for must be gone.  Then it is released and the
        gang marked (``reservation_expired``); returns whether the gang
        holds it."""
        held = self._reservation
        since = held.since if held is not None and held.gang_key == gang_key else now
        limit = since + self.max_reservation_seconds
        if awaited_end is not None:
            limit = min(limit, max(awaited_end, since))
        if now > limit:
            self._entries[gang_key].reservation_expired = True
            self._release_if_held_by(gang_key)
            return False
        self._reservation = Reservation(gang_key, frozenset(nodes), since, ready_at)
        return True

    def reservation_expired(self, gang_key: str) -> bool:
        entry = self._entries.get(gang_key)
        return entry is not None and entry.reservation_expired

    def release_reservation(self) -> None:
        self._reservation = None

    def reserved_against(self, gang_key: str) -> frozenset[str]:
        """The nodes ``gang_key`` may not use: those reserved by a gang
        ordered before it."""
        held = self._reservation
        if held is None or held.gang_key == gang_key or held.gang_key not in self._entries:
            return frozenset()
        entry = self._entries.get(gang_key)
        if entry is not None and entry.order < self._entries[held.gang_key].order:
            return frozenset()
        return held.nodes

    def _release_if_held_by(self, gang_key: str) -> None:
        if self._reservation is not None and self._reservation.gang_key == gang_key:
            self._reservation = None
