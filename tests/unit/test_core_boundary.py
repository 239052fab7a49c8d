"""The decision core stays pure: no client (batchsched.kube), network, event loop, metrics or shell."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CORE = ROOT / "batchsched" / "core"
FORBIDDEN = ("kubernetes", "aiohttp", "asyncio", "prometheus_client", "batchsched.kube", "batchsched.shell", "batchsched.sim")


def imported_modules(tree: ast.AST, package: str) -> list[str]:
    """Absolute names of everything ``tree`` imports; ``package`` resolves
    relative imports."""
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[:len(package.split(".")) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            names.append(module)
            # `from batchsched import shell` names the shell through an alias
            names += [f"{module}.{alias.name}" for alias in node.names]
    return names


def forbidden(module: str) -> bool:
    return any(module == f or module.startswith(f + ".") for f in FORBIDDEN)


def test_core_imports_nothing_impure():
    files = sorted(CORE.rglob("*.py"))
    assert len(files) > 5, f"only {len(files)} files under {CORE}"
    offenders = []
    for path in files:
        package = ".".join(path.relative_to(ROOT).parent.parts)
        for module in imported_modules(ast.parse(path.read_text(), filename=str(path)), package):
            if forbidden(module):
                offenders.append(f"{path.relative_to(ROOT)}: {module}")
    assert offenders == []


def test_the_check_itself_catches_forbidden_imports():
    source = ("import asyncio\nfrom kubernetes import client\nfrom batchsched import shell\n"
              "from ...shell import kube\nfrom ..model import PodInfo\nimport json\nfrom batchsched.kube.client import Kube\n")
    found = [m for m in imported_modules(ast.parse(source), "batchsched.core.placement") if forbidden(m)]
    assert found == ["asyncio", "kubernetes", "kubernetes.client", "batchsched.shell",
                     "batchsched.shell", "batchsched.shell.kube", "batchsched.kube.client",
                     "batchsched.kube.client.Kube"]


# The node agent shares the scheduler's logging and /metrics server, nothing
# else of its shell: its client and Events come from batchsched.kube.
NODE_AGENT_MAY_USE = ("batchsched.shell.logs", "batchsched.shell.server")


def test_the_node_agent_takes_its_client_from_batchsched_kube_not_the_shell():
    files = sorted((ROOT / "batchsched" / "nodeagent").rglob("*.py"))
    assert len(files) > 3, f"only {len(files)} files under batchsched/nodeagent"
    offenders = []
    for path in files:
        package = ".".join(path.relative_to(ROOT).parent.parts)
        for module in imported_modules(ast.parse(path.read_text(), filename=str(path)), package):
            if (module == "batchsched.shell" or module.startswith("batchsched.shell.")) \
                    and not module.startswith(NODE_AGENT_MAY_USE):
                offenders.append(f"{path.relative_to(ROOT)}: {module}")
    assert offenders == []
