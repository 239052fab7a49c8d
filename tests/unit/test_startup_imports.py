"""What the scheduler loads at start (issue 16, start to first bind): the
CEL evaluator (cel-python and its parser) and networkx are loaded on first
use, not on import, so a scheduler on a cluster with no DRA selector pays
nothing for them (bench/RESULTS.md, "Start-up imports")."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LAZY = ("celpy", "lark", "networkx")


def test_starting_the_scheduler_loads_neither_the_cel_evaluator_nor_networkx():
    loaded = subprocess.run(
        [sys.executable, "-c", "import sys, batchsched.cli, batchsched.shell.scheduler; "
                               f"print(sorted(m for m in {LAZY!r} if m in sys.modules))"],
        check=True, capture_output=True, text=True).stdout.strip()
    assert loaded == "[]"


def test_they_are_loaded_when_first_needed():
    fixture = ROOT / "tests" / "fixtures" / "topologies" / "dgx1-hybrid-cube-mesh-8gpu.txt"
    loaded = subprocess.run(
        [sys.executable, "-c", "import sys; from batchsched.core.dra.selector import compile_selector; "
                               "from batchsched.core.topology.parse import parse_topo; "
                               "compile_selector('device.driver == \"gpu.nvidia.com\"'); "
                               f"parse_topo(open({str(fixture)!r}).read()).nvlink_groups(); "
                               f"print(sorted(m for m in {LAZY!r} if m in sys.modules))"],
        check=True, capture_output=True, text=True).stdout.strip()
    assert loaded == "['celpy', 'lark', 'networkx']"


def test_choosing_gpus_loads_no_networkx():
    """Choosing GPUs (the first cycle on a cluster with topology annotations)
    leaves networkx to the reports that draw NVLink groups."""
    fixture = ROOT / "tests" / "fixtures" / "topologies" / "dgx1-hybrid-cube-mesh-8gpu.txt"
    loaded = subprocess.run(
        [sys.executable, "-c", "import sys; from batchsched.core.topology.parse import parse_topo; "
                               "from batchsched.core.topology.choose import choose_gpus; "
                               f"topology = parse_topo(open({str(fixture)!r}).read()); "
                               "[choose_gpus(topology, 0xff, k) for k in range(1, 9)]; "
                               "print('networkx' in sys.modules)"],
        check=True, capture_output=True, text=True).stdout.strip()
    assert loaded == "False"


def test_starting_the_scheduler_loads_not_the_synchronous_kubernetes_client():
    """kubernetes.aio alone (shell/kube.py): the package's __init__ would
    load the whole synchronous client, ~225 modules nothing here uses; a
    later ``from kubernetes import client`` (the tests' own helpers) still works."""
    out = subprocess.run(
        [sys.executable, "-c", "import sys, batchsched.cli, batchsched.shell.scheduler; "
                               "print('kubernetes.client' in sys.modules, 'kubernetes.aio.client' in sys.modules); "
                               "from kubernetes import client; print(hasattr(client, 'CoreV1Api'))"],
        check=True, capture_output=True, text=True).stdout.split()
    assert out == ["False", "True", "True"]
