"""The CEL libraries for DRA device selectors, measured side by side (issue 12).

    python bench/cel_selectors.py [--lib batchsched|celpy|cel|cel_expr_python] [--evals 2000]

Each candidate runs in a Python that has it (one venv each: they are not
all dependencies of batchsched); ``batchsched`` is the chosen library behind
``batchsched.core.dra.cel`` with its checks. For ~10 DRA selectors over 8
NVIDIA-like devices it prints compile time, evaluations per second and
whether each result matches the expected one; then what each library does
with the ``quantity``/``semver`` extensions, a missing attribute (must be a
runtime error), an unknown function (must be refused) and a catastrophic
regular expression on 30 characters.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

NV = "gpu.nvidia.com"
K8S = "resource.kubernetes.io"


def devices() -> list[dict]:
    """8 GPUs: 6 H100 80Gi on driver 550, 2 A100 40Gi on 535; gpu-7 a MIG device."""
    found = []
    for minor in range(8):
        h100 = minor < 6
        found.append({
            "name": f"gpu-{minor}",
            "attributes": {
                "uuid": f"GPU-{minor:08x}-aaaa-bbbb-cccc-{minor:012d}",
                "productName": "NVIDIA H100 80GB HBM3" if h100 else "NVIDIA A100-SXM4-40GB",
                "type": "mig" if minor == 7 else "gpu",
                "driverVersion": ("version", "550.54.15" if h100 else "535.104.5"),
                f"{K8S}/pciBusID": f"0000:{0x07 + 0x10 * minor:02x}:00.0",
                f"{K8S}/pcieRoot": f"pci0000:{0 if minor < 4 else 0x80:02x}",
                "numaNode": 0 if minor < 4 else 1,
            },
            "capacity": {"memory": "80Gi" if h100 else "40Gi"},
        })
    return found


ALL, H100 = [True] * 8, [True] * 6 + [False] * 2
SELECTORS: list[tuple[str, list[bool] | str]] = [  # expression, expected per device (or "error")
    (f'device.driver == "{NV}"', ALL),
    (f"device.driver == '{NV}' && device.attributes['{NV}'].type == 'gpu'", [True] * 7 + [False]),
    (f'device.attributes["{NV}"].productName == "NVIDIA H100 80GB HBM3"', H100),
    (f'device.attributes["{NV}"].productName.startsWith("NVIDIA A100")', [not h for h in H100]),
    (f'device.attributes["{NV}"].numaNode == 1 && device.attributes["{K8S}"].pcieRoot == "pci0000:80"',
     [False] * 4 + [True] * 4),
    (f'"productName" in device.attributes["{NV}"] && !("cliqueId" in device.attributes["{NV}"])', ALL),
    (f'device.attributes["{K8S}"].pciBusID.matches("^0000:[0-9a-f]{{2}}:00\\\\.0$")', ALL),
    (f'device.capacity["{NV}"].memory.isGreaterThan(quantity("40Gi"))', H100),
    (f'device.capacity["{NV}"].memory.compareTo(quantity("80Gi")) >= 0', H100),
    (f'device.attributes["{NV}"].driverVersion.isGreaterThan(semver("550.0.0"))', H100),
    (f'device.attributes["{NV}"].uuid.lowerAscii().endsWith("000000000003")', [m == 3 for m in range(8)]),
    (f'device.attributes["{NV}"].cliqueId == "x"', "error"),
]
UNKNOWN_FUNCTION = 'device.driver.frobnicate() == "x"'
CATASTROPHIC = '"' + "a" * 30 + '!".matches("^(a+)+$")'


# ---- adapters: compile(expression) -> run(device) -> bool (raises on error) -------

def adapter_batchsched():
    from batchsched.core.dra.cel import compile_selector
    from batchsched.core.dra.model import Device, Version

    def device(d: dict) -> Device:
        attributes = {}
        for key, value in d["attributes"].items():
            value = Version(value[1]) if isinstance(value, tuple) else value
            attributes[key] = value
            if "/" not in key:
                attributes[f"{NV}/{key}"] = value
        return Device(d["name"], attributes, d["capacity"])

    def compile_(expression: str):
        selector = compile_selector(expression)
        return lambda d: selector.matches(NV, d)
    return compile_, device


def _nested(d: dict, version, quantity) -> dict:
    attributes: dict = {}
    for key, value in d["attributes"].items():
        domain, _, name = key.rpartition("/")
        attributes.setdefault(domain or NV, {})[name] = version(value[1]) if isinstance(value, tuple) else value
    capacity = {NV: {k: quantity(v) for k, v in d["capacity"].items()}}
    return {"driver": NV, "attributes": attributes, "capacity": capacity, "allowMultipleAllocations": False}


def adapter_celpy():
    """Raw celpy, with the same extension functions batchsched registers."""
    import celpy
    from batchsched.core.dra import cel as ours
    env = celpy.Environment()

    def compile_(expression: str):
        program = env.program(env.compile(expression), functions=ours._FUNCTIONS)
        return lambda d: bool(program.evaluate({"device": d}))

    def device(d: dict):
        return celpy.json_to_cel(_nested(d, str, str)) | {
            celpy.celtypes.StringType("attributes"): ours._by_domain(NV, _flat(d, ours.Version), ours._cel_value),
            celpy.celtypes.StringType("capacity"): ours._by_domain(NV, d["capacity"], ours.Quantity.parse)}
    return compile_, device


def _flat(d: dict, version) -> dict:
    return {k: version(v[1]) if isinstance(v, tuple) else v for k, v in d["attributes"].items()}


def adapter_cel():
    """common-expression-language (Rust): plain values only; quantity/semver as Python functions."""
    import cel

    functions = {"quantity": lambda s: s, "semver": lambda s: s}

    def compile_(expression: str):
        program = cel.compile(expression)
        return lambda d: program.execute(cel.Context(variables={"device": d}, functions=functions))
    return compile_, lambda d: _nested(d, str, str)


def adapter_cel_expr_python():
    """cel-expr-python (cel-cpp): checked; quantity/semver as abstract types with Python functions."""
    from cel_expr_python import cel
    from cel_expr_python.ext import ext_strings
    quantity_type, semver_type = cel.Type.AbstractType("Quantity"), cel.Type.AbstractType("Semver")
    env = cel.NewEnv(
        variables={"device": cel.Type.Map(cel.Type.STRING, cel.Type.DYN)}, extensions=[ext_strings.ExtStrings()],
        functions=[
            cel.FunctionDecl("quantity", [cel.Overload("quantity_string", quantity_type, [cel.Type.STRING],
                                                       impl=lambda s: s)]),
            cel.FunctionDecl("semver", [cel.Overload("semver_string", semver_type, [cel.Type.STRING],
                                                     impl=lambda s: s)]),
            # a semver overload next to this one is refused (ALREADY_EXISTS): abstract types are
            # one runtime kind, so isGreaterThan serves quantities only here
            cel.FunctionDecl("isGreaterThan", [
                cel.Overload("quantity_gt", cel.Type.BOOL, [quantity_type, quantity_type], is_member=True,
                             impl=lambda a, b: a > b)]),
            cel.FunctionDecl("compareTo", [
                cel.Overload("quantity_cmp", cel.Type.INT, [quantity_type, quantity_type], is_member=True,
                             impl=lambda a, b: 0)])])

    def compile_(expression: str):
        program = env.compile(expression)

        def run(d):
            value = program.eval(data={"device": d})
            if value.type() == cel.Type.ERROR:
                raise RuntimeError(value.value())
            return value.value()
        return run
    return compile_, lambda d: _nested(d, str, str)


ADAPTERS = {"batchsched": adapter_batchsched, "celpy": adapter_celpy, "cel": adapter_cel,
            "cel_expr_python": adapter_cel_expr_python}


def outcome(run, device) -> str:
    try:
        return str(bool(run(device)))
    except Exception as error:  # what the library does is the figure
        return f"error ({type(error).__name__}: {str(error).splitlines()[0][:70]})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lib", choices=sorted(ADAPTERS), default="batchsched")
    parser.add_argument("--evals", type=int, default=2000, help="evaluations timed per selector")
    args = parser.parse_args()
    compile_, convert = ADAPTERS[args.lib]()
    fleet = [convert(d) for d in devices()]
    print(f"## {args.lib}\n\n| selector | compile ms | evals/s | correct |\n|---|---|---|---|")
    correct = 0
    for expression, expected in SELECTORS:
        start = time.perf_counter()
        try:
            run = compile_(expression)
        except Exception as error:
            print(f"| `{expression[:70]}` | refused: {str(error).splitlines()[0][:60]} | - | no |")
            continue
        compile_ms = (time.perf_counter() - start) * 1000
        got = [outcome(run, d) for d in fleet]
        ok = all(g.startswith("error") for g in got) if expected == "error" else got == [str(e) for e in expected]
        correct += ok
        start, n = time.perf_counter(), 0
        while n < args.evals:
            for d in fleet:
                outcome(run, d)
            n += len(fleet)
        rate = n / (time.perf_counter() - start)
        note = "yes" if ok else f"no: {sorted(set(got))[:2]}"
        print(f"| `{expression[:70]}` | {compile_ms:.2f} | {rate:,.0f} | {note} |")
    print(f"\ncorrect: {correct}/{len(SELECTORS)}")
    for label, expression in (("unknown function", UNKNOWN_FUNCTION), ("(a+)+$ on 30 chars", CATASTROPHIC)):
        start = time.perf_counter()
        try:
            result = outcome(compile_(expression), fleet[0])
        except Exception as error:
            result = f"refused at compile ({str(error).splitlines()[0][:70]})"
        print(f"{label}: {result} in {(time.perf_counter() - start) * 1000:.1f} ms")


if __name__ == "__main__":
    main()
