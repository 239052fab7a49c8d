"""Kubeconfig resolved as kubectl does it (the pure parts, and files in tmp_path)."""
import asyncio
from pathlib import Path

import pytest
import yaml

from batchsched.kube.client import KubeconfigError, kubeconfig_paths, merge_kubeconfigs, resolve_target


def config(current: str, *contexts: tuple[str, str], server="https://example:6443", ca="ca.crt") -> dict:
    return {"current-context": current,
            "clusters": [{"name": c, "cluster": {"server": server, "certificate-authority": ca}}
                         for c in {cluster for _, cluster in contexts}],
            "contexts": [{"name": n, "context": {"cluster": c}} for n, c in contexts]}


def test_paths_follow_kubectls_precedence(tmp_path):
    home = tmp_path
    assert kubeconfig_paths("~/x", {"KUBECONFIG": "/a"}, home) == [Path("~/x").expanduser()]
    assert kubeconfig_paths(None, {"KUBECONFIG": "/a::/b:/a"}, home) == [Path("/a"), Path("/b")]
    assert kubeconfig_paths(None, {"KUBECONFIG": ""}, home) == [home / ".kube" / "config"]
    assert kubeconfig_paths(None, {}, home) == [home / ".kube" / "config"]


def test_the_first_file_wins_current_context_and_each_name():
    merged = merge_kubeconfigs([
        (Path("/one/config"), config("", ("shared", "c1"))),
        (Path("/two/config"), config("second", ("shared", "c2"), ("second", "c2"), ca="/abs/ca.crt")),
        (Path("/three/config"), config("third", ("third", "c2"))),
    ])
    assert merged["current-context"] == "second"  # the first non-empty one; the client's merger takes the last
    assert [c["context"]["cluster"] for c in merged["contexts"]] == ["c1", "c2", "c2"]
    cas = {c["name"]: c["cluster"]["certificate-authority"] for c in merged["clusters"]}
    assert cas == {"c1": "/one/ca.crt", "c2": "/abs/ca.crt"}  # relative to the file that names it


def resolve(tmp_path, monkeypatch, kubeconfig=None, context=None, environ=None):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    return asyncio.run(resolve_target(kubeconfig, context, environ or {}, tmp_path))


def test_the_contexts_namespace_and_a_context_without_user(tmp_path, monkeypatch):
    path = tmp_path / ".kube" / "config"
    path.parent.mkdir()
    document = config("a", ("a", "c"), ("b", "c"))
    document["contexts"][1]["context"]["namespace"] = "team-b"
    path.write_text(yaml.safe_dump(document))
    (path.parent / "ca.crt").write_text("read by the TLS context only when connecting")
    target = resolve(tmp_path, monkeypatch)
    assert (target.namespace, target.configuration.host) == ("default", "https://example:6443")
    assert resolve(tmp_path, monkeypatch, context="b").namespace == "team-b"


@pytest.mark.parametrize("kubeconfig,context,wording", [
    ("absent.yaml", None, "absent.yaml: No such file or directory"),
    (None, None, "no configuration: no kubeconfig at"),
    (None, "nope", "context 'nope' not found"),
])
def test_errors_say_what_is_wrong_in_one_line(tmp_path, monkeypatch, kubeconfig, context, wording):
    with pytest.raises(KubeconfigError) as caught:
        resolve(tmp_path, monkeypatch, kubeconfig and str(tmp_path / kubeconfig), context)
    assert wording in str(caught.value) and "\n" not in str(caught.value)


def test_a_file_without_current_context_names_the_choices(tmp_path, monkeypatch):
    path = tmp_path / "k.yaml"
    path.write_text(yaml.safe_dump(config("", ("a", "c"), ("b", "c"))))
    with pytest.raises(KubeconfigError, match=r"sets no current-context: pass --context \(contexts: a, b\)"):
        resolve(tmp_path, monkeypatch, str(path))
