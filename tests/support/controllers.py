"""The pods the Job and Deployment controllers would create.

The local control plane runs no kube-controller-manager, so tests that apply
a Job or Deployment create its pods themselves, from the object as the API
server returned it (defaulted, with the labels it adds to a Job's template).
"""
from __future__ import annotations

import copy


def pod_from_template(owner: dict, name: str, labels: dict, annotations: dict, **spec) -> dict:
    template = copy.deepcopy(owner["spec"]["template"])
    meta = template.get("metadata") or {}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": owner["metadata"]["namespace"],
                         "labels": {**(meta.get("labels") or {}), **labels},
                         "annotations": {**(meta.get("annotations") or {}), **annotations}},
            "spec": {**template["spec"], **spec}}


def indexed_job_pods(job: dict) -> list[dict]:
    """What the Job controller creates for an Indexed Job: pod i named
    <job>-<i>-<suffix>, with hostname <job>-<i> and its completion index."""
    name = job["metadata"]["name"]
    pods = []
    for index in range(job["spec"]["parallelism"]):
        p = pod_from_template(job, f"{name}-{index}-x{index:04d}",
                              {"batch.kubernetes.io/job-completion-index": str(index)},
                              {"batch.kubernetes.io/job-completion-index": str(index)},
                              hostname=f"{name}-{index}")
        p["metadata"]["ownerReferences"] = [{"apiVersion": "batch/v1", "kind": "Job", "name": name,
                                             "uid": job["metadata"]["uid"], "controller": True,
                                             "blockOwnerDeletion": True}]
        for container in p["spec"]["containers"]:
            container.setdefault("env", []).append({"name": "JOB_COMPLETION_INDEX", "value": str(index)})
        pods.append(p)
    return pods


def deployment_pods(deployment: dict) -> list[dict]:
    """What its ReplicaSet creates: <deployment>-<hash>-<suffix> with the pod-template-hash label."""
    name, template_hash = deployment["metadata"]["name"], "5d8f7c9b6"
    return [pod_from_template(deployment, f"{name}-{template_hash}-r{i}", {"pod-template-hash": template_hash}, {})
            for i in range(deployment["spec"]["replicas"])]


def controller_pods(owner: dict) -> list[dict]:
    return indexed_job_pods(owner) if owner["kind"] == "Job" else deployment_pods(owner)
