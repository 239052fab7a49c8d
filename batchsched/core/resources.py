"""Resource quantities in integer canonical units.

cpu is counted in millicores, memory and storage in bytes, every other
resource (pods, nvidia.com/gpu, MIG profiles, ...) in whole units, rounded up
the way the API server rounds a quantity's integer value.

Quantities come from tenants (PodGroup minResources, pod requests), so they
are bounded before any arithmetic: at most ``MAX_QUANTITY_LENGTH``
characters, a decimal exponent of at most ``MAX_EXPONENT`` either way, and a
canonical magnitude of at most ``MAX_CANONICAL`` (2^63-1, where the API
server's resource.Quantity stops too).  Parsing is O(length).
"""
from __future__ import annotations

import functools
import math
import re
from fractions import Fraction
from typing import Mapping

from batchsched.core.text import clip

Resources = dict[str, int]

CPU = "cpu"
MEMORY = "memory"
PODS = "pods"

_SUFFIX = {
    "": 1, "n": Fraction(1, 10**9), "u": Fraction(1, 10**6), "m": Fraction(1, 1000),
    "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
}
MAX_QUANTITY_LENGTH = 64
MAX_EXPONENT = 64
MAX_CANONICAL = 2**63 - 1
_QUANTITY = re.compile(r"^([+-]?[0-9.]+)(?:[eE]([+-]?[0-9]+))?(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]?)$")


class QuantityError(ValueError):
    pass


def parse_quantity(text: str | int | float) -> Fraction:
    """Parse a Kubernetes quantity ("500m", "1Gi", "2e3") exactly; raises
    QuantityError for anything else, or beyond the bounds above."""
    if isinstance(text, bool):
        raise QuantityError(f"invalid quantity {text!r}")
    if isinstance(text, int):
        if abs(text) > MAX_CANONICAL:
            raise QuantityError(f"quantity {_shown(text)} exceeds {MAX_CANONICAL}")
        return Fraction(text)
    if isinstance(text, float):
        if not math.isfinite(text) or abs(text) > MAX_CANONICAL:
            raise QuantityError(f"quantity {text!r} is not a finite number up to {MAX_CANONICAL}")
        return Fraction(text)
    if not isinstance(text, str) or len(text) > MAX_QUANTITY_LENGTH:
        raise QuantityError(f"invalid quantity {_shown(text)}: not a string of at most "
                            f"{MAX_QUANTITY_LENGTH} characters")
    match = _QUANTITY.match(text.strip())
    if not match:
        raise QuantityError(f"invalid quantity {text!r}")
    number, exponent, suffix = match.groups()
    try:
        value = Fraction(number)
    except ValueError as exc:
        raise QuantityError(f"invalid quantity {text!r}") from exc
    if exponent:
        power = int(exponent)
        if abs(power) > MAX_EXPONENT:  # 10**power is what would take hours
            raise QuantityError(f"quantity {text!r}: exponent beyond +-{MAX_EXPONENT}")
        value *= Fraction(10) ** power
    return value * _SUFFIX[suffix]


def _shown(value: object) -> str:
    """A hostile value, short enough for a message (a huge int is not even printed)."""
    return clip(repr(value), MAX_QUANTITY_LENGTH) if not isinstance(value, int) else f"of {value.bit_length()} bits"


def canonical(name: str, text: str | int | float) -> int:
    """A quantity in the canonical integer unit for resource ``name``."""
    if isinstance(text, str):
        return _canonical_text(name, text)
    return _canonical(name, text)


@functools.lru_cache(maxsize=4096)  # every pod of a workload repeats the same few quantities
def _canonical_text(name: str, text: str) -> int:
    return _canonical(name, text)


def _canonical(name: str, text: str | int | float) -> int:
    value = parse_quantity(text)
    if name == CPU:
        value *= 1000
    amount = math.ceil(value)
    if abs(amount) > MAX_CANONICAL:
        raise QuantityError(f"{name} quantity {_shown(text)} exceeds {MAX_CANONICAL} "
                            f"{'millicores' if name == CPU else 'canonical units'}")
    return amount


def parse_resource_map(raw: Mapping[str, object] | None) -> Resources:
    return {name: canonical(name, q) for name, q in (raw or {}).items()}


def add(a: Mapping[str, int], b: Mapping[str, int]) -> Resources:
    out = dict(a)
    for k, v in b.items():
        out[k] = out.get(k, 0) + v
    return out


def subtract(a: Mapping[str, int], b: Mapping[str, int]) -> Resources:
    out = dict(a)
    for k, v in b.items():
        out[k] = out.get(k, 0) - v
    return out


def shortfall(request: Mapping[str, int], free: Mapping[str, int]) -> list[str]:
    """Names of the requested resources that ``free`` cannot cover."""
    return [k for k, v in request.items() if v > 0 and free.get(k, 0) < v]


def format_amount(name: str, amount: int) -> str:
    if name == CPU:
        return f"{amount}m" if amount % 1000 else str(amount // 1000)
    if name == MEMORY:
        for suffix, size in (("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10)):
            if amount and amount % size == 0:
                return f"{amount // size}{suffix}"
    return str(amount)
