"""CEL device selectors (core/dra/cel.py): the Kubernetes DRA environment,
runtime errors, refusals with a reason, and hostile expressions bounded."""
from __future__ import annotations

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batchsched.core.dra import cel
from batchsched.core.dra.cel import MAX_COST, SelectorError, compile_selector
from batchsched.core.dra.model import Device, Version, slice_from_json

NV = "gpu.nvidia.com"


def gpu(**extra) -> Device:
    """An H100 as NVIDIA's driver publishes it, read through slice_from_json."""
    attributes = {"uuid": {"string": "GPU-0a1b"}, "productName": {"string": "NVIDIA H100 80GB HBM3"},
                  "type": {"string": "gpu"}, "driverVersion": {"version": "550.54.15"},
                  "cudaComputeCapability": {"version": "9.0.0"}, "index": {"int": 3}, "mig": {"bool": False},
                  "resource.kubernetes.io/pciBusID": {"string": "0000:37:00.0"},
                  "resource.kubernetes.io/pcieRoot": {"string": "pci0000:30"}, **extra}
    obj = {"metadata": {"name": "s"}, "spec": {"driver": NV, "nodeName": "n", "pool": {"name": "n"}, "devices": [
        {"name": "gpu-3", "attributes": attributes, "capacity": {"memory": {"value": "80Gi"}}}]}}
    return slice_from_json(obj).devices[0]


def selects(expression: str, device: Device | None = None, driver: str = NV) -> bool:
    return compile_selector(expression).matches(driver, device or gpu())


def test_a_version_attribute_keeps_its_type():
    device = gpu()
    assert isinstance(device.attributes["driverVersion"], Version)
    assert type(device.attributes["productName"]) is str


@pytest.mark.parametrize("expression, expected", [
    # the variable
    (f'device.driver == "{NV}"', True),
    ('device.driver == "gpu.example.com"', False),
    ("device.allowMultipleAllocations", False),
    # attributes: the driver's own by its domain, others by theirs
    (f'device.attributes["{NV}"].productName == "NVIDIA H100 80GB HBM3"', True),
    (f"device.attributes['{NV}'].type == 'gpu' && device.attributes['{NV}'].index == 3", True),
    (f'device.attributes["{NV}"].mig == false', True),
    ('device.attributes["resource.kubernetes.io"].pcieRoot == "pci0000:30"', True),
    (f'"productName" in device.attributes["{NV}"]', True),
    (f'"pciBusID" in device.attributes["{NV}"]', False),  # it is resource.kubernetes.io's
    ('"x" in device.attributes["other.example.com"]', False),  # an unpublished domain is empty
    (f'has(device.attributes["{NV}"].uuid)', True),
    (f'device.attributes["{NV}"].exists(name, name == "uuid")', True),
    (f'device.attributes["{NV}"].all(name, name.size() < 40)', True),
    (f'device.attributes["{NV}"].index == "3"', False),  # another type is unequal, as in Kubernetes
    (f'device.attributes["{NV}"].mig == 0', False),
    (f'device.attributes["{NV}"].index == 3.0', True),
    # quantities
    (f'device.capacity["{NV}"].memory.isGreaterThan(quantity("40Gi"))', True),
    (f'device.capacity["{NV}"].memory.isLessThan(quantity("80G"))', False),  # 80Gi > 80G
    (f'device.capacity["{NV}"].memory.compareTo(quantity("81920Mi")) == 0', True),
    (f'device.capacity["{NV}"].memory == quantity("81920Mi")', True),
    (f'device.capacity["{NV}"].memory.sub(quantity("16Gi")).isGreaterThan(quantity("60Gi"))', True),
    (f'device.capacity["{NV}"].memory.asInteger() == 85899345920', True),
    ('quantity("1.5").isInteger() || quantity("-2m").sign() != -1', False),
    ('isQuantity("40Gi") && !isQuantity("40 Gi") && quantity("1e3").asApproximateFloat() == 1000.0', True),
    # semantic versions
    (f'device.attributes["{NV}"].driverVersion.isGreaterThan(semver("550.0.0"))', True),
    (f'device.attributes["{NV}"].driverVersion.isLessThan(semver("550.54.15-rc.1"))', False),
    (f'device.attributes["{NV}"].cudaComputeCapability.compareTo(semver("9.0.0")) == 0', True),
    (f'device.attributes["{NV}"].driverVersion.major() == 550 && '
     f'device.attributes["{NV}"].driverVersion.minor() == 54', True),
    (f'device.attributes["{NV}"].driverVersion.patch() == 15', True),
    (f'device.attributes["{NV}"].driverVersion == semver("550.54.15+build.7")', True),  # build ignored
    ('semver("1.0.0-alpha").isLessThan(semver("1.0.0-alpha.1")) && '
     'semver("1.0.0-alpha.beta").isLessThan(semver("1.0.0-beta")) && '
     'semver("1.0.0-rc.1").isLessThan(semver("1.0.0"))', True),
    ('isSemver("1.2.3") && !isSemver("1.2") && !isSemver("01.2.3") && isSemver("v1.2", true)', True),
    ('semver("v1.2", true) == semver("1.2.0")', True),
    # strings
    (f'device.attributes["{NV}"].productName.startsWith("NVIDIA H") && '
     f'device.attributes["{NV}"].productName.endsWith("HBM3")', True),
    (f'device.attributes["{NV}"].productName.contains("80GB")', True),
    ('device.attributes["resource.kubernetes.io"].pciBusID.matches("^0000:[0-9a-f]{2}:00\\\\.0$")', True),
    (f'device.attributes["{NV}"].uuid.lowerAscii() == "gpu-0a1b"', True),
    (f'device.attributes["{NV}"].uuid.upperAscii() == "GPU-0A1B"', True),
    ('"  a ".trim() == "a" && "abcb".indexOf("b") == 1 && "abcb".lastIndexOf("b") == 3', True),
    ('"abc".substring(1) == "bc" && "abc".substring(0, 2) == "ab" && "abc".charAt(1) == "b"', True),
    ('"a-b".replace("-", "_") == "a_b" && [1, 2].size() == 2 && size("ab") == 2', True),
    ('int("3") == 3 && string(3) == "3" && double(1) == 1.0 && uint(2) == 2u && bool("true")', True),
    ('[1, 2, 3].filter(x, x > 1).size() == 2 && [1, 2].map(x, x * 2) == [2, 4] && [1, 2].exists_one(x, x == 2)',
     True),
])
def test_each_supported_form(expression, expected):
    assert selects(expression) is expected


def test_a_missing_attribute_is_a_runtime_error_not_false():
    with pytest.raises(SelectorError, match=r"failed on device gpu-3: no such member in mapping: 'cliqueId'"):
        selects(f'device.attributes["{NV}"].cliqueId == "x"')
    with pytest.raises(SelectorError, match="no such member"):
        selects(f'device.capacity["{NV}"].cores.isGreaterThan(quantity("1"))')
    # CEL's logic absorbs an error where the other side decides, as Kubernetes does
    assert selects(f'device.driver == "other" && device.attributes["{NV}"].cliqueId == "x"') is False
    assert selects(f'device.attributes["{NV}"].cliqueId == "x" || true') is True


@pytest.mark.parametrize("expression, why", [
    (f'device.attributes["{NV}"].uuid.frobnicate()', "method 'frobnicate' is not supported in a device selector"),
    ('timestamp("2020-01-01T00:00:00Z") > timestamp("2019-01-01T00:00:00Z")', "function 'timestamp' is not supported"),
    ("[1].reduce(a, x, 0, a + x) > 0", "method 'reduce' is not supported"),
    ('pod.name == "x"', "undeclared reference to 'pod' (the only variable is device)"),
    ("google.protobuf.Int64Value{value: 1} == 1", "message construction"),
    ('.device.driver == "x"', "a leading-dot name"),
    ("[1, 2].all(x, [3].exists(y, y > x))", "a comprehension (exists) inside another is not supported"),
    ("[[1]].all(x, x.all(y, y > 0))", "a comprehension (all) inside another"),
    ("[1].all(1, true)", "all() takes a variable name and an expression"),
    ("device.driver ==", "syntax error"),
    ('"abc', "the string literal at character 0 is not terminated"),
    ("a" * (cel.MAX_EXPRESSION + 1), "longer than 10240 characters"),
])
def test_what_is_not_supported_is_refused_with_the_reason(expression, why):
    with pytest.raises(SelectorError, match=r"^selector .*" + __import__("re").escape(why)):
        compile_selector(expression)


def test_runtime_type_errors_and_non_bool_results_say_so():
    with pytest.raises(SelectorError, match="evaluates to int, not bool"):
        selects("1 + 1")
    with pytest.raises(SelectorError, match="comparing quantity with semver"):
        selects('quantity("1").isGreaterThan(semver("1.0.0"))')
    with pytest.raises(SelectorError, match="'1.2' is not a semantic version"):
        selects('semver("1.2") == semver("1.2.0")')
    with pytest.raises(SelectorError, match="'40 Gi' is not a quantity"):
        selects('quantity("40 Gi").sign() == 1')
    with pytest.raises(SelectorError, match="out of range"):
        selects('"abc".substring(2, 9) == ""')


def test_compiled_selectors_and_refusals_are_cached_by_expression():
    expression = f'device.driver == "{NV}" && device.attributes["{NV}"].index > 0'
    assert compile_selector(expression) is compile_selector(expression)
    hostile = "[" + ",".join(["1"] * 2000) + "].exists(x, x == 2)"
    with pytest.raises(SelectorError):
        compile_selector(hostile)
    start = time.perf_counter()
    with pytest.raises(SelectorError, match="may cost more than"):
        compile_selector(hostile)
    assert time.perf_counter() - start < 0.05  # not parsed again
    assert cel._compiled.cache_info().maxsize == cel.CACHE_SIZE


# ---- hostile expressions, bounded ------------------------------------------------

def bounded(expression: str, limit_s: float = 1.0) -> str:
    """Compile and evaluate on a device with 31 attributes; rejected or not,
    it must be done within ``limit_s`` (the accepted worst case is ~60 ms)."""
    names = {f"k{i}": {"string": "k"} for i in range(22)}  # 32 attributes and capacities in all
    device = gpu(**names)
    start = time.perf_counter()
    try:
        compile_selector(expression).matches(NV, device)
        outcome = "evaluated"
    except SelectorError as error:
        outcome = str(error)
    elapsed = time.perf_counter() - start
    assert elapsed < limit_s, f"{elapsed:.2f}s for {expression[:80]!r}: {outcome[:200]}"
    return outcome


@pytest.mark.parametrize("expression, outcome", [
    # celpy's lexer takes exponential time on an unterminated string with escapes (11 s at 22 of them)
    ('"' + "\\x41" * 2500, "is not terminated"),
    ('device.driver == "' + "\\101" * 2500, "is not terminated"),
    ("'''" + "\\'" * 3000, "is not terminated"),
    ('"' + "\\x41" * 30 + '\n"', "is not terminated"),
    # comprehensions: nesting refused, a range times its body bounded
    ("[1,2,3].all(a, [1,2,3].all(b, [1,2,3].all(c, true)))", "inside another"),
    ("[" + ",".join(["1"] * 2000) + "].all(x, x == 1)", f"may cost more than {MAX_COST} steps"),
    (f'device.attributes["{NV}"].all(k, ' + " && ".join(['k.lowerAscii().startsWith("k")'] * 40) + ")",
     f"may cost more than {MAX_COST} steps"),
    ("{" + ",".join(f"{i}: {i}" for i in range(800)) + "}.exists(k, k == 5)", f"may cost more than {MAX_COST}"),
    # depth: the evaluator recurses
    ("(" * 33 + "true" + ")" * 33, "brackets nest more than 32 deep"),
    ("!" * 5000 + "true", "nests too deeply"),
    ("-" * 5000 + "1 < 0", "nests too deeply"),
    # long flat expressions
    (" && ".join(['"' + "a" * 100 + '".lowerAscii().replace("a", "bb").matches("b+")'] * 60),
     f"may cost more than {MAX_COST}"),
    (" && ".join([f'device.attributes["{NV}"].k1 == "k"'] * 200), "may cost more than"),
    # work inside one call: RE2 (no backtracking), strings built bounded
    ('"' + "a" * 5000 + '!".matches("^(a+)+$")', "evaluated"),
    ('"' + "a" * 3000 + '".matches("' + "(a|aa)*" * 100 + 'b")', "evaluated"),
    ('"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"'
     '.replace("a", "' + "a" * 200 + '").replace("a", "' + "a" * 200 + '").size() > 0', "more than 10240 characters"),
    ('"a".matches("(")', "failed on device"),
])
def test_hostile_expressions_are_refused_or_run_within_a_bound(expression, outcome):
    assert outcome in bounded(expression)


def test_the_accepted_worst_case_runs_in_well_under_a_second():
    # just under the cost bound: a device's map as the range, the largest body that passes
    body = " && ".join(['k.lowerAscii().startsWith("k")'] * 2)
    assert bounded(f'device.attributes["{NV}"].all(k, {body})', 0.5) == "evaluated"
    flat = " && ".join(['"' + "a" * 100 + '".lowerAscii().replace("a", "bb").matches("b+")'] * 40)
    assert bounded(flat, 0.5) == "evaluated"


CEL_TOKENS = st.sampled_from([
    "device", ".", "driver", "attributes", "capacity", "[", "]", "(", ")", "{", "}", '"gpu.nvidia.com"', "'x'",
    "==", "!=", "&&", "||", "!", "-", "+", "*", "/", "%", "<", ">=", "in", "?", ":", ",", "1", "2u", "1.5",
    "true", "null", "x", "all", "exists", "map", "quantity", "semver", "isGreaterThan", "matches", "size", '"\\',
    "'''", '"""', "r'", "b'", "\\x41", "//", "\n", " ", "has", "compareTo", '"(a+)+$"', "frobnicate"])


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(max_size=200), st.lists(CEL_TOKENS, max_size=40).map("".join)))
def test_compile_selector_raises_nothing_but_selector_error(expression):
    try:
        selector = compile_selector(expression)
    except SelectorError:
        return
    try:
        selector.matches(NV, gpu())
    except SelectorError:
        pass


# ---- the fast path agrees with celpy ---------------------------------------------

@settings(max_examples=200, deadline=None)
@given(driver=st.sampled_from([NV, "gpu.example.com"]),
       terms=st.lists(st.one_of(
           st.sampled_from([NV, "gpu.example.com"]).map(lambda d: f'device.driver == "{d}"'),
           st.tuples(st.sampled_from([NV, "resource.kubernetes.io", "other.io"]),
                     st.sampled_from(["type", "index", "pcieRoot", "driverVersion", "missing"]),
                     st.sampled_from(["gpu", "3", "pci0000:30", "550.54.15"])).map(
               lambda t: f"device.attributes['{t[0]}'].{t[1]} == '{t[2]}'")), min_size=1, max_size=4))
def test_the_equality_fast_path_answers_as_cel_does(driver, terms):
    fast = compile_selector(" && ".join(terms))
    slow = compile_selector(" && ".join(f"({t})" for t in terms))  # parentheses: not the fast path's shape
    assert fast._equalities is not None and slow._equalities is None
    answers = []
    for selector in (fast, slow):
        try:
            answers.append(selector.matches(driver, gpu()))
        except SelectorError as error:
            answers.append(str(error).rpartition(": ")[2])
    assert answers[0] == answers[1]


def test_an_error_inside_parentheses_or_an_index_stays_an_error():
    # celpy hands such an error to == as a value; equality must not turn it into false
    for expression in (f'(device.attributes["{NV}"].missing == "gpu")', f'device.attributes["{NV}"]["missing"] == 1',
                       f'device.attributes["{NV}"]["missing"] != 1'):
        with pytest.raises(SelectorError, match="missing"):
            selects(expression)
