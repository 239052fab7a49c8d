"""`batchsched explain` and `run` against the local control plane: kubeconfig
resolved as kubectl does it, one-line errors, and explain's forms."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from batchsched.api import constants
from batchsched.kube.client import merge_kubeconfigs
from tests.integration.test_gang_scheduling import make_gang
from tests.support.objects import pod

ROOT = Path(__file__).resolve().parents[2]
DEAD_SERVER = "https://127.0.0.1:1"  # nothing listens: a config that reaches it fails to connect


def batchsched(*args: str, home: Path, kubeconfig_variable: str | None = None) -> subprocess.CompletedProcess:
    """The CLI as an operator runs it: only HOME and $KUBECONFIG say where the cluster is."""
    environment = {k: v for k, v in os.environ.items()
                   if k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT")}
    environment.update(HOME=str(home), PYTHONPATH=str(ROOT))
    if kubeconfig_variable is not None:
        environment["KUBECONFIG"] = kubeconfig_variable
    return subprocess.run([sys.executable, "-m", "batchsched", *args], capture_output=True, text=True,
                          timeout=60, env=environment, cwd=home)


def working_config(kubeconfig: str, namespace: str | None = None, context: str = "work") -> dict:
    """The fixture's kubeconfig under one context name, file paths made absolute, in a namespace."""
    path = Path(kubeconfig)
    merged = merge_kubeconfigs([(path, yaml.safe_load(path.read_text()))])
    current = next(c for c in merged["contexts"] if c["name"] == merged["current-context"])
    settings = {**current["context"], **({"namespace": namespace} if namespace else {})}
    return {**merged, "contexts": [{"name": context, "context": settings}], "current-context": context}


def dead_config(*context_names: str) -> dict:
    """Contexts that all lead nowhere; the first is current."""
    return {"apiVersion": "v1", "kind": "Config", "current-context": context_names[0],
            "clusters": [{"name": "dead", "cluster": {"server": DEAD_SERVER, "insecure-skip-tls-verify": True}}],
            "contexts": [{"name": n, "context": {"cluster": "dead"}} for n in context_names]}


def write(path: Path, document: dict) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(document))
    return str(path)


@pytest.fixture
def gang(env):
    env.add_node("gpu0", gpus=8)
    make_gang(env, "train", 1, gpus=8, cpu="1")
    return f"Gang {env.namespace}/train: minMember 1"


def test_kubeconfig_variable_is_a_list_merged_as_kubectl_does(env, kubeconfig, gang, tmp_path):
    """Missing entries are skipped, the first file to set current-context or
    to name a context wins it, the context's namespace is the default, and
    ~/.kube/config is not read while $KUBECONFIG is set."""
    home = tmp_path / "home"
    write(home / ".kube" / "config", dead_config("home"))
    good = write(tmp_path / "a.yaml", working_config(kubeconfig, env.namespace))
    later = write(tmp_path / "b.yaml", dead_config("later", "work"))  # current-context and "work" again
    out = batchsched("explain", "train", home=home,
                     kubeconfig_variable=os.pathsep.join([str(tmp_path / "missing.yaml"), good, later]))
    assert out.returncode == 0, out.stderr
    assert gang in out.stdout


def test_home_kube_config_without_the_variable(env, kubeconfig, gang, tmp_path):
    home = tmp_path / "home"
    write(home / ".kube" / "config", working_config(kubeconfig, env.namespace))
    out = batchsched("explain", "train", home=home)
    assert out.returncode == 0, out.stderr
    assert gang in out.stdout


def test_flag_beats_the_variable_and_context_picks_the_context(env, kubeconfig, gang, tmp_path):
    both = dead_config("nowhere")
    work = working_config(kubeconfig, env.namespace, context="mine")
    both.update(clusters=both["clusters"] + work["clusters"], users=work["users"],
                contexts=both["contexts"] + work["contexts"])
    flag_file = write(tmp_path / "both.yaml", both)
    variable_file = write(tmp_path / "dead.yaml", dead_config("mine"))
    out = batchsched("explain", "train", "--kubeconfig", flag_file, "--context", "mine", home=tmp_path,
                     kubeconfig_variable=variable_file)
    assert out.returncode == 0, out.stderr
    assert gang in out.stdout
    # -n beats the context's namespace
    out = batchsched("explain", "-n", "elsewhere", "train", "--kubeconfig", flag_file, "--context", "mine",
                     home=tmp_path)
    assert out.returncode == 1
    assert "No PodGroup or pod gang elsewhere/train is known." in out.stdout


@pytest.mark.parametrize("command", ["explain", "run"])
def test_config_errors_are_one_line(command, kubeconfig, tmp_path):
    good = write(tmp_path / "good.yaml", working_config(kubeconfig))
    (tmp_path / "bad.yaml").write_text("clusters: [\n")
    cases = {
        "no such file": (["--kubeconfig", str(tmp_path / "absent.yaml")], None, str(tmp_path / "absent.yaml")),
        "no config at all": ([], None, "no configuration"),
        "unknown context": (["--context", "nope"], good, "context 'nope' not found"),
        "not YAML": (["--kubeconfig", str(tmp_path / "bad.yaml")], None, "not valid YAML"),
    }
    for case, (flags, variable, wording) in cases.items():
        args = [command, *flags] + (["anything"] if command == "explain" else [])
        out = batchsched(*args, home=tmp_path, kubeconfig_variable=variable)  # (no .kube there)
        assert out.returncode == 1, (case, out.stderr)
        assert "Traceback" not in out.stderr, case
        assert len(out.stderr.strip().splitlines()) == 1, (case, out.stderr)
        assert wording in out.stderr, (case, out.stderr)


def test_explain_forms_lone_pod_list_and_json(env, kubeconfig, tmp_path):
    home = tmp_path / "home"
    write(home / ".kube" / "config", working_config(kubeconfig, env.namespace))
    gpu0 = env.add_node("gpu0", gpus=4)
    make_gang(env, "train", 2, gpus=8, cpu="1")
    env.create(pod("solo", env.namespace, gpus=8))

    lone = batchsched("explain", "pod/solo", home=home)
    assert lone.returncode == 0, lone.stderr
    assert f"Gang {env.namespace}/pod:solo: minMember 1" in lone.stdout
    assert f"{gpu0}: Insufficient nvidia.com/gpu" in lone.stdout
    member = batchsched("explain", "pod/train-1", home=home)
    assert f"Gang {env.namespace}/train: minMember 2" in member.stdout

    listing = batchsched("explain", home=home)
    assert listing.returncode == 0, listing.stderr
    assert listing.stdout.splitlines() == [
        f"{env.namespace}/pod:solo: Exceeds cluster capacity: gang {env.namespace}/pod:solo needs 1 pod placed at "
        "once; it asks 8 nvidia.com/gpu, the cluster has 4 allocatable.",
        f"{env.namespace}/train: Exceeds cluster capacity: gang {env.namespace}/train needs 2 pods placed at once; "
        "they ask 16 nvidia.com/gpu, the cluster has 4 allocatable.",
    ]

    data = json.loads(batchsched("explain", "-o", "json", "-n", env.namespace, "train", home=home).stdout)
    assert data["gang"] == f"{env.namespace}/train" and data["need"] == 2
    assert data["members"] == {"total": 2, "bound": 0, "pending": 2, "gated": 0}
    [shape] = data["shapes"]
    assert shape["room"] == 0 and shape["requests"]["nvidia.com/gpu"] == "8"
    assert {"node": gpu0, "fits": 0, "reasons": ["Insufficient nvidia.com/gpu"]} in shape["nodes"]
    listed = json.loads(batchsched("explain", "-o", "json", home=home).stdout)
    assert [d["gang"] for d in listed] == [f"{env.namespace}/pod:solo", f"{env.namespace}/train"]


def test_explain_prints_each_warning_once(env, kubeconfig, tmp_path):
    home = tmp_path / "home"
    write(home / ".kube" / "config", working_config(kubeconfig, env.namespace))
    bad = env.add_node("badtopo", gpus=8, annotations={constants.GPU_TOPOLOGY_ANNOTATION: "{not json"})
    make_gang(env, "train", 1, gpus=8, cpu="1")
    out = batchsched("explain", home=home)
    assert out.returncode == 0, out.stderr
    warnings = [line for line in out.stderr.splitlines() if bad in line]
    assert len(warnings) == 1, out.stderr


def test_kubectl_runs_explain_as_its_batchsched_plugin(env, kubeconfig, kubectl, tmp_path):
    """`kubectl batchsched explain NS/NAME`: kubectl finds `kubectl-batchsched`
    (the package's console script) on PATH and hands it the rest."""
    plugin = Path(sys.executable).parent / "kubectl-batchsched"
    assert plugin.exists(), f"{plugin} is missing: the package is not installed (pip install -e .)"
    env.add_node("gpu0", gpus=4)
    make_gang(env, "train", 2, gpus=8, cpu="1")
    environment = {k: v for k, v in os.environ.items() if k not in ("KUBERNETES_SERVICE_HOST",)}
    environment.update(KUBECONFIG=write(tmp_path / "config", working_config(kubeconfig)),
                       PATH=f"{plugin.parent}{os.pathsep}{Path(kubectl).parent}{os.pathsep}/usr/bin:/bin",
                       PYTHONPATH=str(ROOT), HOME=str(tmp_path))
    listed = subprocess.run([kubectl, "plugin", "list"], capture_output=True, text=True, timeout=60, env=environment)
    assert str(plugin) in listed.stdout, listed.stdout + listed.stderr
    out = subprocess.run([kubectl, "batchsched", "explain", f"{env.namespace}/train"], capture_output=True,
                         text=True, timeout=60, env=environment)
    assert out.returncode == 0, out.stderr
    assert f"Gang {env.namespace}/train: minMember 2" in out.stdout
    assert "Exceeds cluster capacity" in out.stdout
    usage = subprocess.run([kubectl, "batchsched", "--help"], capture_output=True, text=True, timeout=60,
                           env=environment)
    assert usage.stdout.startswith("usage: kubectl batchsched")
