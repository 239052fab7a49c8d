"""The gang sources' registry (issue 40): one plugin per source, each one's
RBAC needs granted by the shipped ClusterRole (deploy/rbac.yaml)."""
from pathlib import Path

import yaml

from batchsched.core import gangsources
from batchsched.core.gangsources.plugin import Rule
from batchsched.core.gangsources.registry import PLUGINS

ROOT = Path(__file__).resolve().parents[2]


def cluster_role_rules() -> list[dict]:
    documents = yaml.safe_load_all((ROOT / "deploy" / "rbac.yaml").read_text())
    roles = [d for d in documents if d and d["kind"] == "ClusterRole" and d["metadata"]["name"] == "batchsched"]
    assert len(roles) == 1
    return roles[0]["rules"]


def ungranted(needs: tuple[Rule, ...], rules: list[dict]) -> list[tuple[str, str, str]]:
    """Each (API group, resource, verb) of ``needs`` no rule grants (a rule
    naming resourceNames grants on those objects only, so it does not count)."""
    return [(need.api_group, need.resource, verb) for need in needs for verb in need.verbs
            if not any(need.api_group in rule["apiGroups"] and need.resource in rule["resources"]
                       and verb in rule["verbs"] and not rule.get("resourceNames") for rule in rules)]


def test_every_gang_source_has_one_plugin_under_its_own_name():
    assert set(PLUGINS) == set(gangsources.PRECEDENCE)
    assert all(plugin.source is gangsources.SOURCES[name] for name, plugin in PLUGINS.items())


def test_every_source_whose_objects_are_watched_needs_to_list_and_watch_them():
    for name, plugin in PLUGINS.items():
        source = plugin.source
        if source.podgroups or name in gangsources.OWNER_SIZED:
            assert Rule(source.api_group, source.plural, ("list", "watch")) in plugin.rbac, name
        if source.podgroups:  # its status is ours to write
            resource = "podgroups/status" if source.status_subresource else "podgroups"
            assert any(r.resource == resource and "patch" in r.verbs for r in plugin.rbac), name


def test_the_shipped_cluster_role_grants_every_registered_source_s_needs():
    rules = cluster_role_rules()
    assert {name: ungranted(plugin.rbac, rules) for name, plugin in PLUGINS.items()} == \
        {name: [] for name in PLUGINS}


def test_the_check_finds_a_need_the_role_does_not_grant():
    rules = cluster_role_rules()
    assert ungranted((Rule("scheduling.volcano.sh", "podgroups/status", ("patch",)),
                      Rule("batch", "jobs", ("list", "delete"))), rules) == \
        [("scheduling.volcano.sh", "podgroups/status", "patch"), ("batch", "jobs", "delete")]
    leader = [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": ["batchsched"],
               "verbs": ["get"]}]
    assert ungranted((Rule("coordination.k8s.io", "leases", ("get",)),), leader) == \
        [("coordination.k8s.io", "leases", "get")]


def test_a_pod_s_task_is_read_only_for_a_source_that_names_one():
    from batchsched.core.readers import pod_from_json

    annotations = {gangsources.VOLCANO_TASK_ANNOTATION: "workers", "scheduling.k8s.io/group-name": "g"}
    pod = {"metadata": {"name": "p", "namespace": "ns", "uid": "u", "annotations": annotations,
                        "labels": {"scheduling.x-k8s.io/pod-group": "g"}}, "spec": {}}
    enabled = frozenset({gangsources.OWN, gangsources.SCHEDULER_PLUGINS, gangsources.VOLCANO})
    assert pod_from_json(pod, enabled).group_source == gangsources.SCHEDULER_PLUGINS  # it comes first
    assert pod_from_json(pod, enabled).task == ""
    volcano_only = frozenset({gangsources.OWN, gangsources.VOLCANO})
    assert (pod_from_json(pod, volcano_only).group_source, pod_from_json(pod, volcano_only).task) == \
        (gangsources.VOLCANO, "workers")
    assert [name for name, source in gangsources.SOURCES.items() if source.task_annotation] == [gangsources.VOLCANO]
