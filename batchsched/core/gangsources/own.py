"""Our own PodGroup (``scheduling.batchsched.io/v1alpha1``): read by
``core/readers.py``'s ``group_from_json``, its status written in full
(phase, counts, the effective priority, conditions, and who bound the
members, which a restart believes; docs/binding.md)."""
from __future__ import annotations

from batchsched.api.podgroup import Condition, PodGroupStatus
from batchsched.core.gangs import bindings_to_record, effective_priority
from batchsched.core.gangsources import OWN, SOURCES
from batchsched.core.gangsources.plugin import SourcePlugin, StatusFacts, watches, writes_status
from batchsched.core.readers import group_from_json, recorded_bindings
from batchsched.core.status import conditions_for


def status(facts: StatusFacts) -> dict:
    counters, spec, members = facts.counters, facts.spec, facts.members
    written = PodGroupStatus(
        phase=facts.phase, observed_generation=facts.obj["metadata"].get("generation", 0),
        bound=counters.bound, running=counters.running, succeeded=counters.succeeded, failed=counters.failed,
        pending=counters.pending, elastic=max(0, counters.bound - facts.min_member),
        priority=effective_priority(spec, members) if spec and members else None,
        conditions=[Condition.model_validate(c) for c in conditions_for(facts.phase, facts.reason, facts.message)],
        schedule_start_time=facts.start_time,
        # what a restart believes of who bound the members (docs/binding.md)
        bound_by_scheduler=bindings_to_record(members, recorded_bindings(facts.obj)) or None).to_json()
    last = facts.written or {}
    for field in ("priority", "boundByScheduler"):
        if field not in written and field in last:
            written[field] = None  # a merge patch removes a field only when told so
    return written


PLUGIN = SourcePlugin(SOURCES[OWN], watches(SOURCES[OWN]) + writes_status(SOURCES[OWN]), group_from_json, status)
