"""Reading the simulator's YAML and CSV inputs with errors that name the
file, the line and the field (docs/simulator.md documents the formats)."""
from __future__ import annotations

import csv
from pathlib import Path
from typing import Any, Iterator, Mapping

import yaml

from batchsched.core import resources as res


class InputError(ValueError):
    """A cluster, workload or trace file that cannot be used; the message
    names the file, the line and the field."""


class Record(dict):
    """One mapping of an input file (a YAML mapping or a CSV row) that
    knows where it came from, so a bad field can be pointed at."""

    def __init__(self, data: Mapping[str, Any], source: str, line: int, where: str = ""):
        super().__init__(data)
        self.source, self.line, self.where = source, line, where

    def error(self, field: str, problem: str) -> InputError:
        path = f"{self.where}.{field}" if self.where else field
        return InputError(f"{self.source}: line {self.line}: {path}: {problem}")

    def text(self, field: str, default: str | None = None) -> str:
        value = self.get(field)
        if value in (None, ""):
            if default is None:
                raise self.error(field, "missing")
            return default
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise self.error(field, f"must be a string, got {value!r}")
        return str(value)

    def _number(self, field: str, default, parse, what: str, minimum):
        value = self.get(field)
        if value in (None, ""):
            if default is None:
                raise self.error(field, "missing")
            return default
        try:
            number = parse(str(value))
        except ValueError:
            raise self.error(field, f"must be {what}, got {value!r}") from None
        if not number >= minimum:  # also refuses NaN
            raise self.error(field, f"must be at least {minimum}, got {value!r}")
        return number

    def integer(self, field: str, default: int | None = None, minimum: int = 0) -> int:
        return self._number(field, default, int, "a whole number", minimum)

    def seconds(self, field: str, default: float | None = None) -> float:
        return self._number(field, default, float, "a number of seconds", 0)

    def quantity(self, field: str, resource: str, default: str) -> str:
        """A Kubernetes quantity ("8", "500m", "64Gi"), checked."""
        value = self.text(field, default)
        try:
            res.canonical(resource, value)
        except res.QuantityError as exc:
            raise self.error(field, str(exc)) from None
        return value

    def choice(self, field: str, options: tuple[str, ...], default: str) -> str:
        value = self.text(field, default)
        if value not in options:
            raise self.error(field, f"must be one of {', '.join(options)}, got {value!r}")
        return value

    def flag(self, field: str, default: bool) -> bool:
        value = self.get(field)
        if value in (None, ""):
            return default
        if isinstance(value, bool):
            return value
        if str(value).lower() in ("true", "false"):
            return str(value).lower() == "true"
        raise self.error(field, f"must be true or false, got {value!r}")

    def labels(self, field: str) -> dict[str, str]:
        """A mapping, or in CSV ``key=value;key=value``."""
        value = self.get(field)
        if value in (None, ""):
            return {}
        if isinstance(value, str):
            pairs = [p.partition("=") for p in value.split(";") if p.strip()]
            if any(not sep or not key.strip() for key, sep, _ in pairs):
                raise self.error(field, f"must be key=value pairs separated by ';', got {value!r}")
            return {key.strip(): val.strip() for key, _, val in pairs}
        if not isinstance(value, Mapping):
            raise self.error(field, f"must be a mapping of label keys to values, got {value!r}")
        return {str(k): str(v) for k, v in value.items()}

    def records(self, field: str) -> list[Record]:
        """A list of mappings (absent: empty)."""
        value = self.get(field)
        if value is None:
            return []
        if not isinstance(value, list) or not all(isinstance(v, Mapping) for v in value):
            raise self.error(field, "must be a list of mappings")
        return [_child(v, self, f"{field}[{i}]") for i, v in enumerate(value)]

    def check_known(self, fields: set[str]) -> None:
        unknown = sorted(set(self) - fields)
        if unknown:
            raise self.error(unknown[0], f"unknown field (known: {', '.join(sorted(fields))})")


def _child(value: Mapping, parent: Record, field: str) -> Record:
    where = f"{parent.where}.{field}" if parent.where else field
    return Record(value, parent.source, getattr(value, "line", parent.line), where)


class _LineMapping(dict):
    line = 0


class _LineLoader(yaml.SafeLoader):
    """A safe loader whose mappings remember their first line."""


def _construct_mapping(loader: _LineLoader, node: yaml.MappingNode) -> _LineMapping:
    mapping = _LineMapping(loader.construct_mapping(node, deep=True))
    mapping.line = node.start_mark.line + 1
    return mapping


_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def read_yaml(path: Path) -> Record:
    """The file's top-level mapping."""
    try:
        data = yaml.load(path.read_text(), Loader=_LineLoader)  # noqa: S506 - a safe loader
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark else ""
        raise InputError(f"{path}: {where}not valid YAML: {getattr(exc, 'problem', exc)}") from None
    if not isinstance(data, Mapping):
        raise InputError(f"{path}: line 1: the file must be a YAML mapping")
    return Record(data, str(path), getattr(data, "line", 1))


def read_csv(path: Path, required: set[str], known: set[str]) -> Iterator[Record]:
    """The rows of a CSV file with a header line, as records."""
    with path.open(newline="") as stream:
        reader = csv.DictReader(stream)
        header = set(reader.fieldnames or ())
        missing, unknown = sorted(required - header), sorted(header - known)
        if missing:
            raise InputError(f"{path}: line 1: the header lacks the column(s) {', '.join(missing)}")
        if unknown:
            raise InputError(f"{path}: line 1: unknown column {unknown[0]!r} (known: {', '.join(sorted(known))})")
        for row in reader:
            if None in row:
                raise InputError(f"{path}: line {reader.line_num}: more cells than the header has columns")
            yield Record({k: v.strip() if isinstance(v, str) else v for k, v in row.items()},
                         str(path), reader.line_num)
