"""The decision core stays pure: no client, network, event loop, metrics or shell."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CORE = ROOT / "batchsched" / "core"
FORBIDDEN = ("kubernetes", "aiohttp", "asyncio", "prometheus_client", "batchsched.shell", "batchsched.sim")


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
              "from ...shell import kube\nfrom ..model import PodInfo\nimport json\n")
    found = [m for m in imported_modules(ast.parse(source), "batchsched.core.placement") if forbidden(m)]
    assert found == ["asyncio", "kubernetes", "kubernetes.client", "batchsched.shell",
                     "batchsched.shell", "batchsched.shell.kube"]
