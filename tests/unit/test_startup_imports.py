"""What the scheduler loads at start (issue 16, start to first bind): the
CEL evaluator (cel-python and its parser) and networkx are loaded on first
use, not on import, so a scheduler on a cluster with no DRA selector pays
nothing for them (bench/RESULTS.md, "Start-up imports")."""
from __future__ import annotations

import os
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
    """kubernetes.aio alone (kube/client.py): the package's __init__ would
    load the whole synchronous client, ~225 modules nothing here uses; a
    later ``from kubernetes import client`` (the tests' own helpers) still works."""
    out = subprocess.run(
        [sys.executable, "-c", "import sys, batchsched.cli, batchsched.shell.scheduler; "
                               "print('kubernetes.client' in sys.modules, 'kubernetes.aio.client' in sys.modules); "
                               "from kubernetes import client; print(hasattr(client, 'CoreV1Api'))"],
        check=True, capture_output=True, text=True).stdout.split()
    assert out == ["False", "True", "True"]


def test_starting_the_scheduler_loads_only_the_client_and_config_of_kubernetes_aio():
    """kubernetes.aio's __init__ would load its dynamic client, watch (and
    pydoc with it), stream, leaderelection and utils modules; kube/client.py
    uses its client and config only.  They still import when asked for."""
    unused = ("kubernetes.aio.dynamic", "kubernetes.aio.watch", "kubernetes.aio.stream",
              "kubernetes.aio.leaderelection", "pydoc")
    out = subprocess.run(
        [sys.executable, "-c", "import sys, batchsched.cli, batchsched.shell.replica; "
                               f"print(sorted(m for m in {unused!r} if m in sys.modules)); "
                               "import kubernetes.aio.watch; print(hasattr(kubernetes.aio.watch, 'Watch'))"],
        check=True, capture_output=True, text=True).stdout.split("\n")
    assert out[:2] == ["[]", "True"]


def test_aiohttp_is_loaded_without_reading_the_certificate_bundle_and_later_contexts_still_read_it():
    """aiohttp's import-time default TLS contexts (never used: sessions get
    the kubeconfig's context) read no certificates; the variables pointing
    OpenSSL at the bundle are restored, so a context made afterwards (the
    kube client's, for a kubeconfig that names no CA) trusts the bundle."""
    import certifi

    env = {**os.environ, "SSL_CERT_FILE": certifi.where(), "SSL_CERT_DIR": "/nonexistent"}
    out = subprocess.run(
        [sys.executable, "-c", "import os, ssl, batchsched.cli, batchsched.shell.replica, aiohttp.connector as c; "
                               "print(c._SSL_CONTEXT_VERIFIED.cert_store_stats()['x509_ca'], "
                               "os.environ['SSL_CERT_FILE'] == " f"{certifi.where()!r}, os.environ['SSL_CERT_DIR'], "
                               "ssl.create_default_context().cert_store_stats()['x509_ca'] > 100)"],
        check=True, capture_output=True, text=True, env=env).stdout.split()
    assert out == ["0", "True", "/nonexistent", "True"]


def test_the_run_command_s_imports_set_off_almost_no_collections():
    """They build long-lived objects only (classes, schemas, patterns); at
    Python's thresholds ~130 collections walked them, ~60 ms of a start
    (bench/RESULTS.md).  ``run`` makes collections rare before importing."""
    out = subprocess.run(
        [sys.executable, "-c", "import gc, sys; seen = []; from batchsched.cli import main; "
                               "gc.callbacks.append(lambda phase, info: seen.append(info['generation']) if phase == 'start' else None); "
                               "code = main(['run', '--config', '/nonexistent/config.yaml']); "
                               "print(code, 'batchsched.shell.scheduler' in sys.modules, len(seen), seen.count(2))"],
        capture_output=True, text=True).stdout.split()
    assert out[:2] == ["1", "True"]  # the config was missing, after everything the start needs was imported
    assert int(out[2]) <= 20 and out[3] == "0"  # (the argument parser's own, on a small heap: ~13)


def test_the_run_command_looks_up_no_pydantic_plugins_unless_the_operator_asks():
    """Pydantic reads every installed distribution's entry points for its
    plugins when it builds its first model; ``run`` uses none and skips
    that, unless PYDANTIC_DISABLE_PLUGINS is set by whoever starts it."""
    script = ("import importlib.metadata as md, os, sys; looked = []; real = md.entry_points; "
              "md.entry_points = lambda **kw: looked.append(kw.get('group')) or real(**kw); "
              "from batchsched.cli import main; "
              "code = main(['run', '--config', '/nonexistent/config.yaml']); "
              "print(code, 'batchsched.shell.scheduler' in sys.modules, 'pydantic' in looked)")
    env = {k: v for k, v in os.environ.items() if k != "PYDANTIC_DISABLE_PLUGINS"}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env).stdout.split()
    assert out == ["1", "True", "False"]  # the config was missing, after the start's imports
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         env={**env, "PYDANTIC_DISABLE_PLUGINS": "some-plugin"}).stdout.split()
    assert out == ["1", "True", "True"]  # one named: the others are still looked up
