"""Change logs (pure): which keys changed since a mark.

For caches kept across cycles: a cache reads what changed since it last
looked instead of checking every entry each cycle.  ``TrackedDict`` is a
dict the shell changes in place (the PodGroups) that logs its own changes:
a key changes when it is set to another object (an equal but new one
included) or removed.
"""
from __future__ import annotations

from typing import Any, Collection, Hashable, Iterable, Mapping, TypeVar

K = TypeVar("K", bound=Hashable)
_MISSING = object()


def changed_after(log: Mapping[K, int], mark: int) -> list[K]:
    """The keys of ``log`` (key -> when it last changed, in that order)
    changed after ``mark``, latest first."""
    changed = []
    for key in reversed(log):
        if log[key] <= mark:
            break
        changed.append(key)
    return changed


class ChangeLog:
    """Each key's last change, in clock order.  Keys no longer live are
    forgotten once the log outgrows the live ones (so it stays bounded); a
    mark from before that gets None from ``since``: any key may have changed."""

    def __init__(self) -> None:
        self._when: dict[Hashable, int] = {}
        self._floor = 0  # changes up to here may have been forgotten

    def note(self, key: Hashable, clock: int, live: Collection[Hashable]) -> None:
        self._when.pop(key, None)  # re-inserted last: the log stays in clock order
        self._when[key] = clock
        if len(self._when) > 2 * len(live) + 1024:
            self._when = {k: c for k, c in self._when.items() if k in live}
            self._floor = clock

    def since(self, mark: int) -> list[Hashable] | None:
        return None if mark < self._floor else changed_after(self._when, mark)


class TrackedDict(dict):
    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._clock = 0
        self._log = ChangeLog()

    @property
    def mark(self) -> int:
        """The change clock now, for ``changed_since``."""
        return self._clock

    def changed_since(self, mark: int) -> list[Hashable] | None:
        """The keys changed after ``mark`` (present or removed), latest first;
        None when ``mark`` is older than the log keeps: then any key may have."""
        return self._log.since(mark)

    def _note(self, key: Hashable) -> None:
        self._clock += 1
        self._log.note(key, self._clock, self)

    def _noted(self, keys: Iterable[Hashable]) -> None:
        for key in keys:
            self._note(key)

    # every mutator of dict, noting the keys it changes

    def __setitem__(self, key: Hashable, value: Any) -> None:
        if self.get(key, _MISSING) is not value:
            super().__setitem__(key, value)
            self._note(key)

    def __delitem__(self, key: Hashable) -> None:
        super().__delitem__(key)
        self._note(key)

    def pop(self, key: Hashable, *default: Any) -> Any:
        present = key in self
        value = super().pop(key, *default)
        if present:
            self._note(key)
        return value

    def popitem(self) -> tuple[Hashable, Any]:
        key, value = super().popitem()
        self._note(key)
        return key, value

    def setdefault(self, key: Hashable, default: Any = None) -> Any:
        if key not in self:
            self[key] = default
        return self[key]

    def update(self, *args: Any, **kwargs: Any) -> None:
        for key, value in dict(*args, **kwargs).items():
            self[key] = value

    def __ior__(self, other: Any) -> TrackedDict:
        self.update(other)
        return self

    def clear(self) -> None:
        keys = list(self)
        super().clear()
        self._noted(keys)
