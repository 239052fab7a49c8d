"""CEL device selectors, as Kubernetes DRA evaluates them.

A DeviceClass (``spec.selectors[].cel.expression``) or a claim request
selects devices with a CEL expression over one variable, ``device``:

* ``device.driver`` (string), ``device.allowMultipleAllocations`` (false);
* ``device.attributes[domain][name]``: int, bool, string or semver; an
  attribute key without a ``/`` is the slice driver's own (``domain`` is the
  driver), ``domain/name`` belongs to ``domain``;
* ``device.capacity[domain][name]``: a quantity, named the same way.

A domain nobody published reads as an empty map, as in Kubernetes, so
``"x" in device.attributes["other.io"]`` is false; a missing *name* is a
runtime error (the device is not selected and the error text is reported).

Kubernetes' extensions DRA users write are provided: ``quantity()``,
``isQuantity()`` and the quantity methods, ``semver()``, ``isSemver()`` and
the semver methods, and the string functions of the ``strings`` extension
listed in ``METHODS``. The expression is evaluated by cel-python (``celpy``,
pure Python; docs/dra.md, "CEL", says why this library), whose regular
expressions are RE2 (linear time, no ReDoS).

Tenants write claim selectors, so an expression is checked before it runs:
every function and method must be one this module knows (never a guess at
an unknown one), comprehensions may not nest, and the estimated work and
the nesting depth are bounded; string literals are checked first because
celpy's own lexer backtracks exponentially on an unterminated one. Anything
refused raises ``SelectorError`` with what and why.
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Callable

import celpy
import lark
from celpy import celtypes
from celpy.evaluation import CELEvalError, bool_eq

from batchsched.core.dra.model import Device, SelectorError, Version
from batchsched.core.text import clip

MAX_EXPRESSION = 10 * 1024  # resource.k8s.io/v1 CELSelectorExpressionMaxLength
MAX_BRACKET_DEPTH = 32  # ( [ { open at once
MAX_TREE_DEPTH = 320  # parse tree levels: celpy evaluates recursively (about 9 levels per CEL operator)
MAX_COST = 2_000  # parse tree nodes one evaluation may visit, comprehensions multiplied out (~60 ms in celpy)
RANGE_GUESS = 32  # entries of a map or list that is not a literal: a device has at most 32 attributes
MAX_STRING = 10 * 1024  # a string a function builds (replace can grow one)
CACHE_SIZE = 1024  # compiled expressions kept

MACROS = frozenset({"all", "exists", "exists_one", "map", "filter"})
FUNCTIONS = frozenset({"has", "size", "int", "uint", "double", "string", "bool",
                       "quantity", "isQuantity", "semver", "isSemver"})
METHODS = frozenset({
    "size", "contains", "startsWith", "endsWith", "matches",  # CEL's own
    "lowerAscii", "upperAscii", "trim", "indexOf", "lastIndexOf", "charAt", "substring", "replace",  # strings ext
    "isGreaterThan", "isLessThan", "compareTo",  # quantity and semver
    "sign", "isInteger", "asInteger", "asApproximateFloat", "add", "sub",  # quantity
    "major", "minor", "patch",  # semver
})
_NOT_CEL_HERE = {"member_object": "message construction (Type{...})",
                 "dot_ident": "a leading-dot name", "dot_ident_arg": "a leading-dot function call"}


# ---- Kubernetes' quantity and semver values ---------------------------------

_QUANTITY = re.compile(r"([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]{1,3})?")
_SUFFIX = {"": Fraction(1), "n": Fraction(1, 10**9), "u": Fraction(1, 10**6), "m": Fraction(1, 1000),
           "k": Fraction(10**3), "M": Fraction(10**6), "G": Fraction(10**9), "T": Fraction(10**12),
           "P": Fraction(10**15), "E": Fraction(10**18), "Ki": Fraction(2**10), "Mi": Fraction(2**20),
           "Gi": Fraction(2**30), "Ti": Fraction(2**40), "Pi": Fraction(2**50), "Ei": Fraction(2**60)}
_INT64 = 2**63


class _Failed(Exception):
    """A function's runtime error; becomes celpy's error value."""


@dataclass(frozen=True)
class Quantity:
    """A resource.Quantity: compared by value ("1Gi" == "1024Mi")."""

    value: Fraction

    @staticmethod
    def parse(text: str) -> Quantity:
        match = _QUANTITY.fullmatch(text) if len(text) <= 64 else None
        if match is None:
            raise _Failed(f"{clip(text, 40)!r} is not a quantity")
        number, suffix = match.group(1), match.group(2) or ""
        scale = _SUFFIX[suffix] if suffix in _SUFFIX else Fraction(10) ** int(suffix[1:])
        return Quantity(Fraction(number) * scale)

    def __str__(self) -> str:
        return str(self.value)


_SEMVER = re.compile(r"(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)"
                     r"(?:-([0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*))?(?:\+([0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*))?")
_LOOSE_SEMVER = re.compile(r"v?([0-9]+)(?:\.([0-9]+))?(?:\.([0-9]+))?((?:[-+][0-9A-Za-z.+-]*)?)")


@dataclass(frozen=True)
class Semver:
    """A semantic version: ordered and compared by precedence (build ignored)."""

    major: int
    minor: int
    patch: int
    pre: tuple[str, ...] = ()
    text: str = field(default="", compare=False)

    @staticmethod
    def parse(text: str, normalize: bool = False) -> Semver:
        if normalize and (loose := _LOOSE_SEMVER.fullmatch(text)):
            text = ".".join(str(int(part or "0")) for part in loose.groups()[:3]) + loose.group(4)
        match = _SEMVER.fullmatch(text) if len(text) <= 64 else None
        pre = tuple(match.group(4).split(".")) if match and match.group(4) else ()
        if match is None or any(p.isdigit() and len(p) > 1 and p[0] == "0" for p in pre):
            raise _Failed(f"{clip(text, 40)!r} is not a semantic version")
        return Semver(int(match.group(1)), int(match.group(2)), int(match.group(3)), pre, text)

    def _precedence(self) -> tuple:
        # a release sorts after its pre-releases; numeric identifiers sort below alphanumeric ones
        pre = tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in self.pre)
        return (self.major, self.minor, self.patch, not self.pre, pre)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Semver) and self._precedence() == other._precedence()

    def __hash__(self) -> int:
        return hash(self._precedence())

    def __str__(self) -> str:
        return self.text


def _compare(a: Any, b: Any) -> int:
    if isinstance(a, Quantity) and isinstance(b, Quantity):
        return (a.value > b.value) - (a.value < b.value)
    if isinstance(a, Semver) and isinstance(b, Semver):
        return (a._precedence() > b._precedence()) - (a._precedence() < b._precedence())
    raise _Failed(f"no overload comparing {_type_name(a)} with {_type_name(b)}")


def _type_name(value: Any) -> str:
    return {Quantity: "quantity", Semver: "semver"}.get(type(value), type(value).__name__.removesuffix("Type").lower())


def _string(value: Any, what: str) -> str:
    if not isinstance(value, celtypes.StringType):
        raise _Failed(f"{what} takes a string, not {_type_name(value)}")
    return str(value)


def _quantity_operand(value: Any) -> Fraction:
    if isinstance(value, Quantity):
        return value.value
    if isinstance(value, celtypes.IntType):
        return Fraction(int(value))
    raise _Failed(f"quantity arithmetic takes a quantity or an int, not {_type_name(value)}")


def _quantity_only(value: Any, what: str) -> Quantity:
    if not isinstance(value, Quantity):
        raise _Failed(f"{what}() is a quantity method, not one of {_type_name(value)}")
    return value


def _semver_only(value: Any, what: str) -> Semver:
    if not isinstance(value, Semver):
        raise _Failed(f"{what}() is a semver method, not one of {_type_name(value)}")
    return value


def _bool_flag(args: tuple, what: str) -> bool:
    if len(args) > 1 or (args and not isinstance(args[0], celtypes.BoolType)):
        raise _Failed(f"{what} takes a string and an optional bool")
    return bool(args and args[0])


def _is_valid(parse: Callable[[], Any]) -> celtypes.BoolType:
    try:
        parse()
    except _Failed:
        return celtypes.BoolType(False)
    return celtypes.BoolType(True)


def _as_integer(q: Quantity) -> celtypes.IntType:
    if q.value.denominator != 1 or not -_INT64 <= q.value.numerator < _INT64:
        raise _Failed(f"quantity {q} is not an int64 integer")
    return celtypes.IntType(q.value.numerator)


def _built(text: str) -> celtypes.StringType:
    if len(text) > MAX_STRING:
        raise _Failed(f"a string of more than {MAX_STRING} characters")
    return celtypes.StringType(text)


def _substring(s: Any, start: Any, end: Any = None) -> celtypes.StringType:
    text = _string(s, "substring")
    stop = len(text) if end is None else int(end)
    if not 0 <= int(start) <= stop <= len(text):
        raise _Failed(f"substring({int(start)}, {stop}) is out of range for a string of {len(text)}")
    return celtypes.StringType(text[int(start):stop])


def _char_at(s: Any, at: Any) -> celtypes.StringType:
    text = _string(s, "charAt")
    if not 0 <= int(at) <= len(text):
        raise _Failed(f"charAt({int(at)}) is out of range for a string of {len(text)}")
    return celtypes.StringType(text[int(at):int(at) + 1])


def _guarded(function: Callable[..., Any]) -> Callable[..., Any]:
    """A runtime error in a function becomes CEL's error value, so ``||``
    and ``&&`` treat it as CEL does; its message names the problem."""
    @functools.wraps(function)
    def call(*args: Any) -> Any:
        try:
            return function(*args)
        except _Failed as error:
            return CELEvalError(str(error))
        except (TypeError, ValueError, OverflowError) as error:
            return CELEvalError(f"{function.__name__.strip('_')}: {clip(str(error), 120)}")
    return call


_FUNCTIONS: dict[str, Callable[..., Any]] = {name: _guarded(f) for name, f in {
    "quantity": lambda s: Quantity.parse(_string(s, "quantity()")),
    "isQuantity": lambda s: _is_valid(lambda: Quantity.parse(_string(s, "isQuantity()"))),
    "semver": lambda s, *flag: Semver.parse(_string(s, "semver()"), _bool_flag(flag, "semver()")),
    "isSemver": lambda s, *flag: _is_valid(lambda: Semver.parse(_string(s, "isSemver()"),
                                                                _bool_flag(flag, "isSemver()"))),
    "compareTo": lambda a, b: celtypes.IntType(_compare(a, b)),
    "isGreaterThan": lambda a, b: celtypes.BoolType(_compare(a, b) > 0),
    "isLessThan": lambda a, b: celtypes.BoolType(_compare(a, b) < 0),
    "sign": lambda q: celtypes.IntType((_quantity_only(q, "sign").value > 0) - (q.value < 0)),
    "isInteger": lambda q: celtypes.BoolType(_quantity_only(q, "isInteger").value.denominator == 1),
    "asInteger": lambda q: _as_integer(_quantity_only(q, "asInteger")),
    "asApproximateFloat": lambda q: celtypes.DoubleType(float(_quantity_only(q, "asApproximateFloat").value)),
    "add": lambda q, x: Quantity(_quantity_only(q, "add").value + _quantity_operand(x)),
    "sub": lambda q, x: Quantity(_quantity_only(q, "sub").value - _quantity_operand(x)),
    "major": lambda v: celtypes.IntType(_semver_only(v, "major").major),
    "minor": lambda v: celtypes.IntType(_semver_only(v, "minor").minor),
    "patch": lambda v: celtypes.IntType(_semver_only(v, "patch").patch),
    "lowerAscii": lambda s: celtypes.StringType(_string(s, "lowerAscii").translate(_LOWER)),
    "upperAscii": lambda s: celtypes.StringType(_string(s, "upperAscii").translate(_UPPER)),
    "trim": lambda s: celtypes.StringType(_string(s, "trim").strip()),
    "indexOf": lambda s, sub: celtypes.IntType(_string(s, "indexOf").find(_string(sub, "indexOf"))),
    "lastIndexOf": lambda s, sub: celtypes.IntType(_string(s, "lastIndexOf").rfind(_string(sub, "lastIndexOf"))),
    "charAt": _char_at,
    "substring": _substring,
    "replace": lambda s, old, new: _built(_string(s, "replace").replace(_string(old, "replace"),
                                                                       _string(new, "replace"))),
}.items()}


def _kind(value: Any) -> Any:
    if isinstance(value, celtypes.BoolType):
        return celtypes.BoolType
    if isinstance(value, (celtypes.IntType, celtypes.UintType, celtypes.DoubleType)):
        return celtypes.DoubleType
    return type(value)


def _equal(a: Any, b: Any) -> Any:
    """CEL's heterogeneous equality, as Kubernetes has it: values of
    different types are unequal (celpy says 1 == true, or fails on 1 == "1");
    numbers compare by value. An error stays an error."""
    if isinstance(a, CELEvalError) or isinstance(b, CELEvalError):
        return a if isinstance(a, CELEvalError) else b
    if _kind(a) is not _kind(b):
        return celtypes.BoolType(False)
    if type(a) is not type(b):  # numbers of two types
        return celtypes.BoolType((float(a) if isinstance(a, float) else int(a))
                                 == (float(b) if isinstance(b, float) else int(b)))
    return bool_eq(a, b)


def _logic(operator: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    """``&&``/``||`` with two errors give the first one (celpy reports "no matching overload")."""
    return lambda a, b: a if isinstance(a, CELEvalError) and isinstance(b, CELEvalError) else operator(a, b)


_FUNCTIONS["_==_"] = _equal
_FUNCTIONS["_!=_"] = lambda a, b: celtypes.logical_not(_equal(a, b))
_FUNCTIONS["_&&_"] = _logic(celtypes.logical_and)
_FUNCTIONS["_||_"] = _logic(celtypes.logical_or)
_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")
_UPPER = str.maketrans("abcdefghijklmnopqrstuvwxyz", "ABCDEFGHIJKLMNOPQRSTUVWXYZ")
_ENVIRONMENT = celpy.Environment()  # note: celpy raises sys.setrecursionlimit to 2500 here


# ---- the static checks --------------------------------------------------------

def _check_literals(expression: str) -> None:
    """Strings terminated, brackets bounded: a linear scan in the order
    celpy's lexer reads (an escape pair first), before celpy sees the text."""
    depth, k, n = 0, 0, len(expression)
    while k < n:
        c = expression[k]
        if c == "/" and expression.startswith("//", k):
            k = expression.find("\n", k)
            k = n if k < 0 else k
        elif c in "\"'":
            quote = expression[k:k + 3] if expression.startswith(c * 3, k) else c
            start, k = k, k + len(quote)
            while not expression.startswith(quote, k):
                if k >= n or (len(quote) == 1 and expression[k] in "\r\n"):
                    raise SelectorError(f"the string literal at character {start} is not terminated")
                k += 2 if expression[k] == "\\" and expression[k + 1:k + 2] in ("\"", "'", "\\") else 1
            k += len(quote) - 1
        elif c in "([{":
            depth += 1
            if depth > MAX_BRACKET_DEPTH:
                raise SelectorError(f"brackets nest more than {MAX_BRACKET_DEPTH} deep")
        elif c in ")]}":
            depth -= 1
        k += 1


def _children(tree: lark.Tree) -> list[lark.Tree]:
    return [c for c in tree.children if isinstance(c, lark.Tree)]


def _name(tree: lark.Tree, at: int) -> str:
    return str(tree.children[at])


def _expressions(tree: lark.Tree | None) -> list[lark.Tree]:
    return _children(tree) if tree is not None else []


def _check_tree(root: lark.Tree) -> int:
    """The names and shapes celpy may run; returns the estimated cost (tree
    nodes visited, a comprehension's body counted once per range entry)."""
    bound = _bound_names(root)
    cost = 0
    # (node, depth, multiplier, inside a comprehension)
    stack: list[tuple[lark.Tree, int, int, bool]] = [(root, 1, 1, False)]
    while stack:
        tree, depth, weight, inside = stack.pop()
        cost += weight
        if depth > MAX_TREE_DEPTH:
            raise SelectorError("the expression nests too deeply")
        if cost > MAX_COST:
            raise SelectorError(f"the expression may cost more than {MAX_COST} steps to evaluate "
                                "(comprehension ranges times their bodies)")
        kind = tree.data
        if kind in _NOT_CEL_HERE:
            raise SelectorError(f"{_NOT_CEL_HERE[kind]} is not supported in a device selector")
        if kind == "ident" and _name(tree, 0) not in bound and _name(tree, 0) != "device":
            raise SelectorError(f"undeclared reference to {clip(_name(tree, 0), 60)!r} "
                                "(the only variable is device)")
        if kind == "ident_arg" and _name(tree, 0) not in FUNCTIONS:
            raise SelectorError(f"function {clip(_name(tree, 0), 60)!r} is not supported in a device selector")
        if kind == "member_dot_arg" and _name(tree, 1) in MACROS:
            if inside:
                raise SelectorError(f"a comprehension ({_name(tree, 1)}) inside another is not supported")
            arguments = _expressions(tree.children[2] if len(tree.children) > 2 else None)
            if len(arguments) != 2 or _macro_variable(arguments[0]) is None:
                raise SelectorError(f"{_name(tree, 1)}() takes a variable name and an expression")
            target = tree.children[0]
            stack.append((target, depth + 1, weight, True))
            stack.append((arguments[0], depth + 1, weight, True))
            stack.append((arguments[1], depth + 1, weight * _range_size(target), True))
            continue
        if kind == "member_dot_arg" and _name(tree, 1) not in METHODS:
            raise SelectorError(f"method {clip(_name(tree, 1), 60)!r} is not supported in a device selector")
        stack.extend((child, depth + 1, weight, inside) for child in _children(tree))
    return cost


def _macro_variable(argument: lark.Tree) -> str | None:
    """The name a comprehension binds: its first argument must be a bare identifier."""
    while len(argument.children) == 1 and isinstance(argument.children[0], lark.Tree):
        argument = argument.children[0]
    return _name(argument, 0) if argument.data == "ident" else None


def _bound_names(root: lark.Tree) -> set[str]:
    names = set()
    for tree in root.iter_subtrees():
        if tree.data == "member_dot_arg" and _name(tree, 1) in MACROS and len(tree.children) > 2:
            arguments = _expressions(tree.children[2])
            if arguments and (name := _macro_variable(arguments[0])):
                names.add(name)
    return names


def _range_size(target: lark.Tree) -> int:
    """At most how many entries a comprehension's range has: a literal has
    no more than its expressions, anything else is a device's map."""
    return max(RANGE_GUESS, sum(1 for _ in target.find_data("expr")))


# ---- the device, as CEL sees it -----------------------------------------------

class _Domains(celtypes.MapType):
    """Domain -> name -> value; a domain nobody published is an empty map,
    as in Kubernetes (its names, not its domains, are what may be missing)."""

    def __getitem__(self, key: Any) -> Any:
        return super().__getitem__(key) if key in self else celtypes.MapType()


def _cel_value(value: Any) -> Any:
    if isinstance(value, bool):
        return celtypes.BoolType(value)
    if isinstance(value, int):
        return celtypes.IntType(value)
    if isinstance(value, Version):
        return Semver.parse(value)
    return celtypes.StringType(value)


def _by_domain(driver: str, entries: dict[str, Any], convert: Callable[[Any], Any]) -> _Domains:
    domains: dict[str, dict] = {}
    for key, value in entries.items():
        domain, _, name = key.rpartition("/")
        try:
            converted = convert(value)
        except _Failed:
            continue  # the API server refuses a malformed version or quantity: never seen in a real slice
        domains.setdefault(domain or driver, {})[celtypes.StringType(name)] = converted
    return _Domains({celtypes.StringType(d): celtypes.MapType(names) for d, names in domains.items()})


_last_device: list[Any] = [None, None, None]  # driver, device, its variable


def _device_variable(driver: str, device: Device) -> celtypes.MapType:
    """The device as CEL sees it; the last one is kept (held, so compared by
    identity), since a device is usually tried by several selectors in a row."""
    if _last_device[1] is device and _last_device[0] == driver:
        return _last_device[2]
    variable = celtypes.MapType({
        celtypes.StringType("driver"): celtypes.StringType(driver),
        celtypes.StringType("attributes"): _by_domain(driver, dict(device.attributes), _cel_value),
        celtypes.StringType("capacity"): _by_domain(driver, dict(device.capacity), Quantity.parse),
        celtypes.StringType("allowMultipleAllocations"): celtypes.BoolType(False),
    })
    _last_device[:] = [driver, device, variable]
    return variable


# ---- the fast path --------------------------------------------------------------

_QUOTED = r"""(?:'([^'\\]*)'|"([^"\\]*)")"""
_DRIVER_TERM = re.compile(rf"device\.driver\s*==\s*{_QUOTED}")
_ATTRIBUTE_TERM = re.compile(rf"device\.attributes\[\s*{_QUOTED}\s*\]\.([A-Za-z_][A-Za-z0-9_]*)\s*==\s*{_QUOTED}")


def _equality_terms(expression: str) -> tuple[tuple[str, str], ...] | None:
    """A conjunction of ``device.driver == "D"`` and
    ``device.attributes["D"].NAME == "V"`` (NVIDIA's own class is written
    so) as ((qualified name or "", value), ...): evaluated without celpy,
    which is ~100 times slower (bench/cel_selectors.py). None for any other
    shape. No escapes in the literals, so a split at ``&&`` never cuts one."""
    terms = []
    for term in (t.strip() for t in expression.split("&&")):
        if match := _DRIVER_TERM.fullmatch(term):
            terms.append(("", match.group(1) if match.group(1) is not None else match.group(2)))
        elif match := _ATTRIBUTE_TERM.fullmatch(term):
            domain = match.group(1) if match.group(1) is not None else match.group(2)
            value = match.group(4) if match.group(4) is not None else match.group(5)
            terms.append((f"{domain}/{match.group(3)}", value))
        else:
            return None
    return tuple(terms)


def _equalities_match(terms: tuple[tuple[str, str], ...], driver: str, device: Device) -> bool | str:
    """CEL's answer for such a conjunction: false if a term is false, else
    an error (its text) if an attribute is missing, else true. A value of
    another type (int, bool, version) is unequal to a string."""
    missing = ""
    for name, value in terms:
        if not name:
            if driver != value:
                return False
        elif name not in device.attributes:
            missing = missing or f"no such member in mapping: {name.rpartition('/')[2]!r}"
        elif not (type(device.attributes[name]) is str and device.attributes[name] == value):
            return False
    return missing or True


# ---- the interface ------------------------------------------------------------

class Selector:
    """A compiled, checked selector (``compile_selector``)."""

    def __init__(self, expression: str, runner: celpy.Runner) -> None:
        self.expression = expression
        self._runner = runner
        self._equalities = _equality_terms(expression)

    def matches(self, driver: str, device: Device) -> bool:
        """Whether it selects ``device`` of ``driver``; a runtime error (a
        missing attribute, a wrong type) raises ``SelectorError``."""
        if self._equalities is not None:
            answer = _equalities_match(self._equalities, driver, device)
            if isinstance(answer, str):
                raise self._failed(device, answer)
            return answer
        try:
            result = self._runner.evaluate({"device": _device_variable(driver, device)})
        except CELEvalError as error:
            raise self._failed(device, str(error.args[0] if error.args else error)) from None
        except Exception as error:  # celpy's own faults on odd input: reported, never a crash
            raise self._failed(device, f"{type(error).__name__}: {error}") from None
        if not isinstance(result, celtypes.BoolType):
            raise SelectorError(f"selector {clip(self.expression, 80)!r} evaluates to "
                                f"{_type_name(result)}, not bool")
        return bool(result)

    def _failed(self, device: Device, why: str) -> SelectorError:
        return SelectorError(f"selector {clip(self.expression, 80)!r} failed on device {device.name}: "
                             f"{clip(why, 160)}")


@functools.lru_cache(maxsize=CACHE_SIZE)
def _compiled(expression: str) -> Selector | SelectorError:
    # failures are cached too: a hostile expression is parsed once
    try:
        if len(expression) > MAX_EXPRESSION:
            raise SelectorError(f"the expression is longer than {MAX_EXPRESSION} characters")
        _check_literals(expression)
        try:
            tree = _ENVIRONMENT.compile(expression)
        except celpy.CELParseError as error:
            raise SelectorError(f"syntax error: {clip(str(error.args[0] if error.args else error), 160)}") from None
        _check_tree(tree)
        return Selector(expression, _ENVIRONMENT.program(tree, functions=_FUNCTIONS))
    except SelectorError as error:
        return SelectorError(f"selector {clip(expression, 80)!r}: {error}")
    except Exception as error:  # a fault of the parser on odd input: refused with its name
        return SelectorError(f"selector {clip(expression, 80)!r} cannot be compiled: "
                             f"{type(error).__name__}: {clip(str(error), 120)}")


def compile_selector(expression: str) -> Selector:
    """The selector ``expression`` is, checked; ``SelectorError`` says why
    not. Kept in a bounded cache by expression."""
    compiled = _compiled(expression)
    if isinstance(compiled, SelectorError):
        raise SelectorError(str(compiled))
    return compiled
