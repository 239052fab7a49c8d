"""Queues in the watch cache: kept raw (their status is written back) and
converted; a change to any retries every waiting gang."""
from __future__ import annotations

import logging

from batchsched.core.queues.model import queue_from_json
from batchsched.core.text import clip
from batchsched.shell.handlers import MAX_PROBLEM_LENGTH

log = logging.getLogger(__name__)


class QueueHandlers:
    """The cache's Queues (``queues_raw``, ``queues``, ``invalid_queues``)."""

    @staticmethod
    def _queue_entry(obj: dict) -> tuple[str, dict]:
        return str((obj.get("metadata") or {}).get("name", "")), obj

    def _replace_queues(self, listed: dict[str, dict]) -> None:
        before = (dict(self.queues), dict(self.invalid_queues))
        self.queues_raw = listed
        self.queues.clear()
        self.invalid_queues.clear()
        for name, obj in listed.items():
            self._convert_queue(name, obj)
        self._queues_changed(before)

    def _apply_queue(self, event_type: str, obj: dict) -> None:
        name, _ = self._queue_entry(obj)
        before = (dict(self.queues), dict(self.invalid_queues))
        self.queues.pop(name, None)
        self.invalid_queues.pop(name, None)
        if event_type == "DELETED":
            self.queues_raw.pop(name, None)
        else:
            self.queues_raw[name] = obj
            self._convert_queue(name, obj)
        self._queues_changed(before)

    def _convert_queue(self, name: str, obj: dict) -> None:
        try:
            self.queues[name] = queue_from_json(obj)
        except Exception as exc:  # noqa: BLE001 - whatever it holds, only this Queue is refused
            why = str(exc) if isinstance(exc, (ValueError, TypeError)) else f"{type(exc).__name__}: {exc}"
            self.invalid_queues[name] = why = clip(why, MAX_PROBLEM_LENGTH)
            log.warning("Queue %s is invalid: %s", name, why)
            self.on_bad_object("Queue", obj, why)

    def _queues_changed(self, before: tuple[dict, dict]) -> None:
        """What any waiting gang may take changed: every one is tried again
        (Queues change seldom; which gangs a parent's change reaches is not
        worth working out)."""
        if before != (self.queues, self.invalid_queues):
            self.touched_gangs.update(self.state.pending_gang_keys())
            self._notify()
