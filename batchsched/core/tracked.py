"""A dict that knows which of its keys changed since a mark (pure).

For caches kept across cycles over a map the shell changes in place, such
as the PodGroups: a cache reads what changed since it last looked instead
of checking every entry each cycle.  A key changes when it is set to
another object (an equal but new one included) or removed.
"""
from __future__ import annotations

from typing import Any, Hashable, Iterable

_MISSING = object()


class TrackedDict(dict):
    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._clock = 0
        self._changes: dict[Hashable, int] = {}  # key -> when it last changed; most recent last
        self._floor = 0  # changes up to here were dropped from the log (removed keys)

    @property
    def mark(self) -> int:
        """The change clock now, for ``changed_since``."""
        return self._clock

    def changed_since(self, mark: int) -> list[Hashable] | None:
        """The keys changed after ``mark`` (present or removed), latest first;
        None when ``mark`` is older than the log keeps: then any key may have."""
        if mark < self._floor:
            return None
        changed = []
        for key in reversed(self._changes):
            if self._changes[key] <= mark:
                break
            changed.append(key)
        return changed

    def _note(self, key: Hashable) -> None:
        self._clock += 1
        self._changes.pop(key, None)  # re-inserted last: the log stays in clock order
        self._changes[key] = self._clock
        if len(self._changes) > 2 * len(self) + 1024:  # forget removed keys, so the log stays bounded
            self._changes = {k: c for k, c in self._changes.items() if k in self}
            self._floor = self._clock

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
