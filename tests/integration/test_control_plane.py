"""Smoke tests of the harness and of kubernetes.aio against a real API server."""
from __future__ import annotations

import asyncio
import os

import pytest

import localcluster
from batchsched.kube.client import ApiError, Kube
from tests.support.kube import wait_for
from tests.support.kubectl import run_kubectl
from tests.support.objects import pod, pod_group

pytestmark = pytest.mark.e2e
LOCAL_ONLY = pytest.mark.skipif(bool(os.environ.get("KUBECONFIG")),
                                reason="checks the local control plane's own build")


def run(coro):
    return asyncio.run(coro)


@LOCAL_ONLY
def test_api_server_reports_pinned_version(kube):
    assert kube.get("/version")["gitVersion"] == localcluster.read_versions()["KUBERNETES_VERSION"]


def test_bind_through_binding_subresource_and_kwok_runs_it(env):
    node = env.add_node("n1", gpus=8)
    env.create(pod("p", env.namespace, gpus=2, cpu="1"))
    uid = env.pods()["p"]["metadata"]["uid"]

    async def bind():
        k = await Kube.connect(env.kubeconfig)
        try:
            await k.bind(env.namespace, "p", uid, node, {"scheduling.batchsched.io/gpu-ids": "0,1"})
        finally:
            await k.close()

    run(bind())
    p = env.pods()["p"]
    assert p["spec"]["nodeName"] == node
    assert p["metadata"]["annotations"]["scheduling.batchsched.io/gpu-ids"] == "0,1"
    wait_for("kwok to run the bound pod", lambda: env.pods()["p"]["status"].get("phase") == "Running")


def test_binding_with_stale_uid_is_refused(env):
    node = env.add_node("n1")
    env.create(pod("p", env.namespace, cpu="1"))

    async def bind():
        k = await Kube.connect(env.kubeconfig)
        try:
            await k.bind(env.namespace, "p", "00000000-0000-0000-0000-000000000000", node)
        finally:
            await k.close()

    with pytest.raises(ApiError) as err:
        run(bind())
    assert err.value.status == 409
    assert not env.pods()["p"]["spec"].get("nodeName")


def test_typed_binding_call_binds_even_when_its_response_cannot_be_parsed(env):
    """The quirk the adapter works around: the API answers a binding with a
    Status, which the typed client declares as V1Binding.  Whatever the typed
    call does with the body, the pod must end up bound; the adapter therefore
    judges a binding by its HTTP status only."""
    from kubernetes.aio import client, config

    node = env.add_node("n1")
    env.create(pod("p", env.namespace, cpu="1"))

    async def typed_bind():
        configuration = client.Configuration()
        await config.load_kube_config(config_file=env.kubeconfig, client_configuration=configuration)
        async with client.ApiClient(configuration) as api:
            body = client.V1Binding(metadata=client.V1ObjectMeta(name="p"),
                                    target=client.V1ObjectReference(kind="Node", name=node))
            try:
                await client.CoreV1Api(api).create_namespaced_pod_binding("p", env.namespace, body)
                return None
            except Exception as exc:  # noqa: BLE001 - the point is to see what it raises
                return exc

    outcome = run(typed_bind())
    assert env.pods()["p"]["spec"]["nodeName"] == node
    # kubernetes 37.0.2 raises a pydantic error ("V1Binding target ...") here;
    # if a client release parses the Status properly this line tells us the
    # workaround in batchsched.kube.client can go.
    assert outcome is None or "V1Binding" in str(outcome), outcome


def test_list_then_watch_sees_changes_and_bookmarks_continue(env):
    async def scenario():
        k = await Kube.connect(env.kubeconfig)
        try:
            listing = await k.request("GET", f"/api/v1/namespaces/{env.namespace}/pods")
            rv = listing["metadata"]["resourceVersion"]
            seen = []

            async def consume():
                async for event in k.watch(f"/api/v1/namespaces/{env.namespace}/pods", rv, timeout_seconds=20):
                    seen.append((event["type"], event["object"]["metadata"].get("name")))
                    if event["type"] == "ADDED":
                        return

            task = asyncio.create_task(consume())
            # created after the list: the watch from the list's resourceVersion must deliver it,
            # however late the watch request itself is
            env.create(pod("watched", env.namespace, cpu="1"))
            await asyncio.wait_for(task, 20)
            return seen
        finally:
            await k.close()

    assert ("ADDED", "watched") in run(scenario())


def test_eviction_api_deletes_pod_and_honours_pdb(env):
    node = env.add_node("n1")
    for name in ("a", "b"):
        env.create(pod(name, env.namespace, cpu="1", labels={"app": name}))
    env.create({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                "metadata": {"name": "keep-b"},
                "spec": {"maxUnavailable": 0, "selector": {"matchLabels": {"app": "b"}}}})
    pods = env.pods()

    async def scenario():
        k = await Kube.connect(env.kubeconfig)
        try:
            for name in ("a", "b"):
                await k.bind(env.namespace, name, pods[name]["metadata"]["uid"], node)
            await asyncio.to_thread(wait_for, "both running", lambda: all(
                p["status"].get("phase") == "Running" for p in env.pods().values()))
            await k.evict(env.namespace, "a", pods["a"]["metadata"]["uid"])
            with pytest.raises(ApiError) as refused:
                await k.evict(env.namespace, "b")
            return refused.value
        finally:
            await k.close()

    refusal = run(scenario())
    assert refusal.status == 429
    wait_for("evicted pod to be gone", lambda: "a" not in env.pods())
    assert "b" in env.pods()


@LOCAL_ONLY
def test_harness_kube_scheduler_places_plain_pods(env):
    node = env.add_node("n1")
    env.create(pod("plain", env.namespace, cpu="1", scheduler="default-scheduler"))
    wait_for("kube-scheduler to bind the plain pod", lambda: env.bound().get("plain") == node)


def test_controllers_create_job_pods_compute_budgets_and_finish_namespace_deletion(env):
    """kube-controller-manager runs: what Jobs, PodDisruptionBudgets and
    namespace deletion need of it happens (e2e/README.md)."""
    template = pod("worker", env.namespace, cpu="1", labels={"app": "worker"})  # batchsched's: left pending
    env.create({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "train"},
                "spec": {"completionMode": "Indexed", "completions": 2, "parallelism": 2,
                         "template": {"metadata": {"labels": {"app": "worker"}},
                                      "spec": {**template["spec"], "restartPolicy": "Never"}}}})
    names = wait_for("the Job controller's pods", lambda: len(found := sorted(env.pods())) == 2 and found)
    assert [n.rsplit("-", 1)[0] for n in names] == ["train-0", "train-1"], names
    env.create({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "workers"},
                "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "worker"}}}})
    budget = f"/apis/policy/v1/namespaces/{env.namespace}/poddisruptionbudgets/workers"
    wait_for("the disruption controller's status", lambda: env.kube.get(budget).get("status", {}).get(
        "expectedPods") == 2)

    doomed = f"{env.namespace}-deleted"
    env.kube.create("/api/v1/namespaces", {"metadata": {"name": doomed}})
    env.kube.create(f"/api/v1/namespaces/{doomed}/pods", pod("p", doomed, cpu="1"))
    env.kube.delete(f"/api/v1/namespaces/{doomed}")
    wait_for("the namespace controller to empty and remove the namespace", lambda: doomed not in {
        n["metadata"]["name"] for n in env.kube.get("/api/v1/namespaces")["items"]}, timeout=60)


def test_binder_reports_a_final_refusal_without_retrying_and_binds_the_rest(env):
    from batchsched.shell.binder import Binder, BindRequest

    node = env.add_node("n1")
    for name in ("good", "replaced"):
        env.create(pod(name, env.namespace, cpu="1"))
    uid = env.pods()["good"]["metadata"]["uid"]

    async def scenario():
        k = await Kube.connect(env.kubeconfig)
        try:
            return await Binder(k, parallelism=4, retries=3).bind_all([
                BindRequest(uid, env.namespace, "good", node, "g", (0,)),
                BindRequest("00000000-0000-0000-0000-000000000000", env.namespace, "replaced", node, "g")])
        finally:
            await k.close()

    good, stale = run(scenario())
    assert good.ok and env.bound()["good"] == node
    assert not stale.ok and stale.error.startswith("409") and stale.seconds < 0.1  # no backoff slept
    assert "replaced" not in env.bound()


def test_a_conflict_after_a_lost_answer_is_settled_by_reading_the_pod_back(env):
    """A bind whose answer was lost may have been committed: the retry then
    gets 409.  The binder reads the pod back instead of calling it unbound
    (which would free its room and GPU ids for a second pod)."""
    from batchsched.shell.binder import Binder, BindRequest

    node, other = env.add_node("n1"), env.add_node("n2")
    for name in ("committed", "elsewhere"):
        env.create(pod(name, env.namespace, cpu="1"))
    pods = env.pods()
    # the first try of each "landed" before the binder heard of it
    for name, target in (("committed", node), ("elsewhere", other)):
        env.kube.create(f"/api/v1/namespaces/{env.namespace}/pods/{name}/binding",
                        {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": name},
                         "target": {"apiVersion": "v1", "kind": "Node", "name": target}})

    async def scenario():
        k = await Kube.connect(env.kubeconfig)
        try:
            return await Binder(k, parallelism=4, retries=0).bind_all([
                BindRequest(pods["committed"]["metadata"]["uid"], env.namespace, "committed", node, "g"),
                BindRequest(pods["elsewhere"]["metadata"]["uid"], env.namespace, "elsewhere", node, "g")])
        finally:
            await k.close()

    committed, elsewhere = run(scenario())
    assert committed.ok and committed.verified
    assert not elsewhere.ok and elsewhere.verified and f"bound to {other}" in elsewhere.error


def test_podgroups_have_names_that_cannot_collide_with_volcanos(env, kubectl):
    """Volcano's PodGroup is `podgroups`, short name `pg`: ours answers to `bspg` and the full name only."""
    env.create(pod_group("g", env.namespace, min_member=2))
    discovery = env.kube.get("/apis/scheduling.batchsched.io/v1alpha1")
    podgroups = next(r for r in discovery["resources"] if r["name"] == "podgroups")
    assert podgroups["shortNames"] == ["bspg"]
    for name in ("bspg", "podgroups.scheduling.batchsched.io"):
        listed = run_kubectl(kubectl, env.kubeconfig, "get", name, "-n", env.namespace, "-o", "name").stdout
        assert listed == "podgroup.scheduling.batchsched.io/g\n"
