"""Relists against a real API server: a list read in many small pages must
leave the watch cache exactly as a fresh list would, bindings in flight
included, and a running scheduler relisted on SIGUSR1 must go on binding
without handing out a GPU twice."""
from __future__ import annotations

import asyncio
import signal

import pytest

from batchsched.api import constants
from batchsched.core.model import pod_with
from batchsched.kube.client import Kube
from batchsched.shell import reflector as reflector_module
from batchsched.shell.cache import ClusterCache
from batchsched.shell.reflector import Reflector
from tests.support.kube import wait_for
from tests.support.metrics import sample
from tests.support.objects import pod, pod_group

pytestmark = pytest.mark.e2e


def settled(env) -> bool:
    """kwok has run every bound pod: nothing changes while we compare two lists."""
    return all(p["status"].get("phase") == "Running" for p in env.pods().values() if p["spec"].get("nodeName"))


def ours(cache: ClusterCache, namespace: str) -> dict:
    return {uid: p for uid, p in cache.pods.items() if p.namespace == namespace}


def test_a_relist_in_many_small_pages_keeps_bindings_and_state_exact(env, scheduler_kubeconfig):
    nodes = [env.add_node(f"n{i}", gpus=8) for i in range(2)]
    ns = env.namespace
    for name, group in [("a-0", "a"), ("a-1", "a"), ("a-2", "a"), ("b-0", "b"), ("b-1", "b"),
                        ("x", None), ("y", None)]:
        env.create(pod(name, ns, group=group, gpus=2, cpu="1", scheduler="batchsched"))
    uid = {name: p["metadata"]["uid"] for name, p in env.pods().items()}

    async def scenario():
        kube = await Kube.connect(scheduler_kubeconfig)
        try:
            async def bind(name: str, node: str, gpus: str) -> None:
                await kube.bind(ns, name, uid[name], node, {constants.GPU_IDS_ANNOTATION: gpus})

            await bind("a-0", nodes[0], "0,1")
            await bind("a-1", nodes[1], "0,1")
            await bind("x", nodes[0], "2,3")
            await bind("y", nodes[1], "2,3")
            wait_for("kwok to run the bound pods", lambda: settled(env))
            cache = ClusterCache("batchsched", env.node_label)
            reflectors = {r.kind: r for r in cache.reflectors(kube)}
            await reflectors["nodes"].list_once()
            pods = reflectors["pods"]
            pods.page_size = 2
            watching = asyncio.create_task(pods.run())
            await pods.synced.wait()
            cache.assume(uid["b-0"], nodes[0], (4, 5))  # bound by us, not confirmed yet
            watching.cancel()  # the watch breaks; what happens now is missed
            await asyncio.gather(watching, return_exceptions=True)
            env.kube.delete(f"/api/v1/namespaces/{ns}/pods/x", gracePeriodSeconds=0)
            await bind("a-2", nodes[0], "6,7")
            env.create(pod("z", ns, gpus=1, cpu="1", scheduler="batchsched"))
            wait_for("x gone and a-2 running", lambda: "x" not in env.pods() and settled(env))
            cache.drain_changes()
            before = dict(cache.pods)

            pages = []
            list_page = kube.request

            async def counted(method, path, **kwargs):
                pages.append(dict(cache.pods) == before)  # the old state, whole, until the last page
                return await list_page(method, path, **kwargs)
            kube.request = counted
            await pods.list_once()  # the relist
            kube.request = list_page

            fresh = ClusterCache("batchsched", env.node_label)
            fresh_reflectors = {r.kind: r for r in fresh.reflectors(kube)}
            await fresh_reflectors["nodes"].list_once()
            await fresh_reflectors["pods"].list_once()  # one page
            fresh.assume(uid["b-0"], nodes[0], (4, 5))
            return cache, fresh, pages
        finally:
            await kube.close()

    cache, fresh, pages = asyncio.run(scenario())
    assert len(pages) >= 4 and all(pages)
    # The same pods, nodes and GPU ids; only what each cache saw bound differs: the relisting one saw
    # a-2 go from unbound to bound (only pods/binding does that), a fresh start proves nothing from a list
    # (its PodGroup's status would: docs/binding.md)
    def seen(c: ClusterCache) -> dict:
        return {uid: pod_with(p, bound_by_scheduler=False) for uid, p in ours(c, env.namespace).items()}
    assert seen(cache) == seen(fresh)
    assert {p.name for p in ours(cache, env.namespace).values() if p.bound_by_scheduler} == {"a-2", "b-0"}
    assert {p.name for p in ours(fresh, env.namespace).values() if p.bound_by_scheduler} == {"b-0"}
    assert sorted(p.name for p in ours(cache, env.namespace).values()) == ["a-0", "a-1", "a-2", "b-0", "b-1", "y", "z"]
    b0 = cache.pods[uid["b-0"]]
    assert (b0.node_name, b0.gpu_ids) == (nodes[0], (4, 5)) and uid["b-0"] in cache.assumed
    for node in nodes:
        assert cache.state.free(node) == fresh.state.free(node)
        assert cache.state.room(node) == fresh.state.room(node)
        assert [pod_with(p, bound_by_scheduler=False) for p in cache.state.bound_pods(node)] == \
            [pod_with(p, bound_by_scheduler=False) for p in fresh.state.bound_pods(node)]
    assert set(cache.state.pending_gang_keys()) == set(fresh.state.pending_gang_keys())
    touched, freed = cache.drain_changes()
    assert {f"{ns}/a", f"{ns}/pod:x", f"{ns}/pod:z"} <= touched and f"{ns}/b" not in touched
    assert freed  # x held 2 GPUs


def test_sigusr1_relists_every_cache_and_scheduling_goes_on_without_double_booking(env, start_scheduler):
    node = env.add_node("gpu0", gpus=8)
    env.create(pod_group("first", env.namespace, 2))
    for i in range(2):
        env.create(pod(f"first-{i}", env.namespace, group="first", gpus=2, cpu="1"))
    proc = start_scheduler()
    wait_for("the first gang bound", lambda: len(env.bound()) == 2)
    wait_for("every cache listed", lambda: proc.log().count(" listed: ") >= 4)
    proc.proc.send_signal(signal.SIGUSR1)
    wait_for("every cache listed again", lambda: proc.log().count(" listed: ") >= 8)
    text = proc.get("/metrics")[1]
    for kind in ("pods", "nodes", "podgroups", "priorityclasses"):
        assert sample(text, "batchsched_watch_restarts_total", f'reason="requested",resource="{kind}"') == 1
    env.create(pod_group("second", env.namespace, 2))
    for i in range(2):
        env.create(pod(f"second-{i}", env.namespace, group="second", gpus=2, cpu="1"))
    wait_for("the second gang bound", lambda: len(env.bound()) == 4)
    gpus = [g for p in env.pods().values()
            for g in p["metadata"]["annotations"][constants.GPU_IDS_ANNOTATION].split(",")]
    assert sorted(gpus) == sorted(set(gpus)) and len(gpus) == 8  # every GPU of the node, each once
    assert set(env.bound().values()) == {node}


def test_a_page_of_large_objects_holds_fewer_of_them(env, monkeypatch, scheduler_kubeconfig):
    """Pages are sized by the JSON the API server sends, as decompressed
    (it gzips answers this large): tenants' big pods come a few at a time."""
    ns = env.namespace
    for i in range(8):
        body = pod(f"big-{i}", ns)
        body["metadata"]["annotations"] = {"note": "x" * 100_000}  # the API server allows 256 KiB
        env.create(body)
    monkeypatch.setattr(reflector_module, "FIRST_PAGE_SIZE", 2)
    monkeypatch.setattr(reflector_module, "PAGE_BYTES", 350_000)

    async def scenario():
        kube = await Kube.connect(scheduler_kubeconfig)
        try:
            listed: dict[str, str] = {}
            reflector = Reflector(kube, f"/api/v1/namespaces/{ns}/pods", "pods",
                                  lambda obj: (obj["metadata"]["uid"], obj["metadata"]["name"]),
                                  listed.update, lambda event_type, obj: None)
            limits, request = [], kube.request

            async def spied(method, path, *, query=None, **kwargs):
                limits.append(query["limit"])
                return await request(method, path, query=query, **kwargs)
            kube.request = spied
            await reflector.list_once()
            return listed, limits
        finally:
            await kube.close()

    listed, limits = asyncio.run(scenario())
    assert sorted(listed.values()) == [f"big-{i}" for i in range(8)]
    assert limits == [2, 3, 3]  # ~102 KB a pod: 3 of them in 350,000 bytes
