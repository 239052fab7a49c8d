"""batchsched's modules import one another without a circle (issue 40).

Every import counts, wherever it is written: at the top, inside a function
(the lazy ones) or under ``if TYPE_CHECKING``, so a circle cannot hide behind
a type-only or a deferred import."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def module_files(root: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every module of batchsched under ``root``."""
    found = {}
    for path in (root / "batchsched").rglob("*.py"):
        parts = list(path.relative_to(root).with_suffix("").parts)
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imports_of(name: str, path: Path, source: str, known: set[str]) -> set[str]:
    """The modules of ``known`` that ``source`` (module ``name`` at ``path``)
    imports anywhere in it; ``from a import b`` names ``a.b`` when that is a
    module, else ``a``."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets = set()
    for node in ast.walk(ast.parse(source, filename=str(path))):
        if isinstance(node, ast.Import):
            candidates = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[:len(package.split(".")) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            candidates = [module] + [f"{module}.{alias.name}" for alias in node.names]
        else:
            continue
        for candidate in candidates:
            while candidate and candidate not in known:
                candidate = candidate.rpartition(".")[0]
            if candidate and candidate != name:
                targets.add(candidate)
    return targets


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's
    algorithm, iterative): each holds at least one circle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            for successor in successors:
                if successor not in index:
                    index[successor] = low[successor] = len(index)
                    stack.append(successor)
                    on_stack.add(successor)
                    work.append((successor, iter(sorted(graph[successor]))))
                    break
                if successor in on_stack:
                    low[node] = min(low[node], index[successor])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    group = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        group.append(member)
                        if member == node:
                            break
                    if len(group) > 1:
                        found.append(sorted(group))
    return found


def import_graph(root: Path) -> dict[str, set[str]]:
    files = module_files(root)
    return {name: imports_of(name, path, path.read_text(), set(files)) for name, path in files.items()}


def test_no_module_of_batchsched_is_in_an_import_circle():
    graph = import_graph(ROOT)
    assert len(graph) > 100, f"only {len(graph)} modules found"
    assert sum(map(len, graph.values())) > 300  # the imports were read
    assert circles(graph) == []


def test_the_check_sees_circles_closed_by_type_only_and_lazy_imports():
    known = {"pkg.a", "pkg.b", "pkg.c", "pkg.sub", "pkg.sub.d"}
    sources = {
        "pkg.a": "from pkg.b import thing\n",
        "pkg.b": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.c import Other\n",
        "pkg.c": "def later():\n    from . import a\n    return a\n",
        "pkg.sub": "",
        "pkg.sub.d": "import json\nfrom .. import sub\n",
    }
    graph = {name: imports_of(name, Path(name.replace(".", "/") + ".py"), source, known)
             for name, source in sources.items()}
    assert graph["pkg.c"] == {"pkg.a"} and graph["pkg.sub.d"] == {"pkg.sub"}
    assert circles(graph) == [["pkg.a", "pkg.b", "pkg.c"]]
    del graph["pkg.c"], graph["pkg.b"]  # a circle needs all of its links
    graph["pkg.a"] = set()
    assert circles(graph) == []
