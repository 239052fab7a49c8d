"""The fault proxy itself, against the real API server: each fault does what it says.

A raw http.client talks to the proxy here (no client library retrying behind
the test's back), and the test's direct client checks what reached etcd.
"""
from __future__ import annotations

import http.client
import json
import threading
import time
from urllib.parse import urlsplit

import pytest

from tests.chaos.proxy import FaultProxy, call
from tests.support.kube import KubeError, wait_for
from tests.support.objects import configmap

pytestmark = pytest.mark.e2e


def exists(env, name: str) -> bool:
    try:
        env.kube.get(f"/api/v1/namespaces/{env.namespace}/configmaps/{name}")
        return True
    except KubeError as exc:
        assert exc.status == 404
        return False


def watch_lines(proxy: FaultProxy, client: str, path: str, out: list, timeout: float = 20) -> threading.Thread:
    """Read a watch through the proxy in a thread: (arrival time, event) into ``out``."""
    def run() -> None:
        url = urlsplit(proxy.urls[client])
        conn = http.client.HTTPConnection(url.hostname, url.port, timeout=timeout)
        conn.request("GET", path, headers={"Authorization": f"Bearer {proxy.token}"})
        resp = conn.getresponse()
        while line := resp.readline():
            out.append((time.monotonic(), json.loads(line)))
        conn.close()
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


@pytest.fixture
def client(proxy, tmp_path) -> str:
    proxy.add_client("tester", tmp_path)
    return "tester"


def test_requests_pass_through_and_are_recorded_per_client(env, proxy, client, tmp_path):
    proxy.add_client("other", tmp_path)
    path = f"/api/v1/namespaces/{env.namespace}/configmaps"
    assert call(proxy, client, "POST", path, configmap("a"))[0] == 201
    assert call(proxy, "other", "GET", f"{path}/a")[2]["data"] == {"k": "v"}
    first, second = proxy.records
    assert (first.client, first.method, first.status, first.committed) == ("tester", "POST", 201, True)
    assert (second.client, second.method, second.status, second.committed) == ("other", "GET", 200, False)
    assert proxy.faults_injected() == 0


@pytest.mark.parametrize("status", [500, 429, 409])
def test_an_injected_status_is_answered_without_forwarding(env, proxy, client, status):
    path = f"/api/v1/namespaces/{env.namespace}/configmaps"
    rule = proxy.add_rule("status", method="POST", path="/configmaps$", status=status, count=1)
    answered, headers, body = call(proxy, client, "POST", path, configmap("a"))
    assert (answered, body["code"]) == (status, status)
    assert headers.get("Retry-After") == ("1" if status == 429 else None)
    assert not exists(env, "a")
    assert call(proxy, client, "POST", path, configmap("a"))[0] == 201  # count=1: spent
    assert (rule.fired, proxy.faults_injected("status")) == (1, 1)


def test_reset_breaks_the_connection_and_sends_nothing(env, proxy, client):
    proxy.add_rule("reset", method="POST", count=1)
    assert call(proxy, client, "POST", f"/api/v1/namespaces/{env.namespace}/configmaps", configmap("a")) is None
    assert not exists(env, "a")
    assert proxy.faults_injected("reset") == 1


def test_drop_reply_commits_the_write_but_the_client_never_hears(env, proxy, client):
    proxy.add_rule("drop_reply", method="POST", count=1)
    assert call(proxy, client, "POST", f"/api/v1/namespaces/{env.namespace}/configmaps", configmap("a")) is None
    assert exists(env, "a")
    (record,) = proxy.records
    assert (record.upstream_status, record.status, record.committed) == (201, 0, True)


def test_probability_and_after_pick_which_requests_fail(env, proxy, client):
    proxy.add_rule("status", method="GET", path="/configmaps$", probability=0.5, after=2)
    path = f"/api/v1/namespaces/{env.namespace}/configmaps"
    statuses = [call(proxy, client, "GET", path)[0] for _ in range(12)]
    assert statuses[:2] == [200, 200]
    assert 500 in statuses[2:] and 200 in statuses[2:]  # seed 11: some of each (deterministic)
    assert proxy.faults_injected() == statuses.count(500)


def test_a_held_request_waits_for_release(env, proxy, client):
    proxy.add_rule("hold", method="POST", count=1)
    result: list = []
    sender = threading.Thread(target=lambda: result.append(
        call(proxy, client, "POST", f"/api/v1/namespaces/{env.namespace}/configmaps", configmap("a"))))
    sender.start()
    wait_for("the request held at the proxy", lambda: proxy.records)
    assert not exists(env, "a") and not result
    proxy.release_held()
    sender.join(10)
    assert result[0][0] == 201 and exists(env, "a")


def test_a_delayed_watch_delivers_every_event_late(env, proxy, client):
    proxy.add_rule("delay", watch=True, seconds=1.5)
    rv = env.kube.get(f"/api/v1/namespaces/{env.namespace}/configmaps")["metadata"]["resourceVersion"]
    events: list = []
    watch_lines(proxy, client, f"/api/v1/namespaces/{env.namespace}/configmaps?watch=true&resourceVersion={rv}",
                events)
    wait_for("the watch open at the proxy", lambda: proxy.live_watches("/configmaps"))
    created_at = time.monotonic()
    env.kube.create(f"/api/v1/namespaces/{env.namespace}/configmaps", configmap("a"))
    # the controller-manager may publish kube-root-ca.crt into the new namespace after rv: not ours to time
    arrived_at, event = wait_for("the event of a", lambda: next(
        (e for e in events if e[1]["object"]["metadata"]["name"] == "a"), None), timeout=10)
    assert event["type"] == "ADDED"
    assert arrived_at - created_at >= 1.5


def test_gone_answers_a_watch_with_410_and_expire_ends_a_live_one(env, proxy, client):
    path = f"/api/v1/namespaces/{env.namespace}/configmaps?watch=true"
    proxy.add_rule("gone", watch=True, count=1)
    events: list = []
    watch_lines(proxy, client, path, events).join(10)
    assert [e["type"] for _, e in events] == ["ERROR"] and events[0][1]["object"]["code"] == 410

    events.clear()
    reader = watch_lines(proxy, client, path, events)
    wait_for("the watch open at the proxy", lambda: proxy.live_watches("/configmaps"))
    assert proxy.expire_watches("/configmaps$") == 1
    reader.join(10)
    assert events[-1][1]["type"] == "ERROR" and events[-1][1]["object"]["code"] == 410
    assert proxy.faults_injected("gone") == 2
