"""The PodGroup API types and the CRD agree."""
from pathlib import Path

import pytest
import yaml

from batchsched.api.podgroup import ObjectMeta, PodGroup, PodGroupSpec, PodGroupStatus, parse_spec
from batchsched.api.queue import Queue, QueueMeta, QueueSpec, QueueStatus, ResourceQuota
from batchsched.core.readers import group_from_json
from batchsched.core.queues.model import queue_from_json

CRD = yaml.safe_load((Path(__file__).resolve().parents[2] / "crds" / "podgroup.yaml").read_text())
SCHEMA = CRD["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]


def test_spec_and_status_fields_are_the_crds():
    spec_fields = {f.alias or name for name, f in PodGroupSpec.model_fields.items()}
    status_fields = {f.alias or name for name, f in PodGroupStatus.model_fields.items()}
    assert spec_fields == set(SCHEMA["spec"]["properties"])
    assert status_fields == set(SCHEMA["status"]["properties"])


def test_printer_columns_read_fields_of_the_schema():
    columns = CRD["spec"]["versions"][0]["additionalPrinterColumns"]
    assert [c["name"] for c in columns if not c.get("priority")] == [
        "Phase", "Queue", "MinMember", "Bound", "Running", "Pending", "Priority", "Reason", "Age"]
    for column in columns:
        top, field = column["jsonPath"].split(".")[1:3]
        field = field.split("[")[0]
        assert top == "metadata" or field in SCHEMA[top]["properties"], column


def test_json_uses_the_api_names_and_leaves_unset_fields_out():
    pg = PodGroup(metadata=ObjectMeta(name="g", namespace="ns"),
                  spec=PodGroupSpec(min_member=4, schedule_timeout_seconds=60))
    assert pg.to_json()["spec"] == {"minMember": 4, "scheduleTimeoutSeconds": 60}
    assert group_from_json(pg.to_json()).min_member == 4
    hinted = PodGroupSpec(expected_runtime_seconds=3600).to_json()
    assert hinted == {"minMember": 1, "expectedRuntimeSeconds": 3600}
    assert group_from_json({"metadata": {"name": "g"}, "spec": hinted}).expected_runtime_seconds == 3600


@pytest.mark.parametrize("spec, problem", [
    ({"minMember": 0}, "spec.minMember: Input should be greater than or equal to 1"),
    ({"minMember": "3"}, "spec.minMember: Input should be a valid integer"),
    ({"minMember": 2, "scheduleTimeoutSeconds": -1}, "spec.scheduleTimeoutSeconds: Input should be greater"),
    ({"minMember": 2, "preemptionPolicy": "Sometimes"}, "spec.preemptionPolicy: Input should be"),
    ({"expectedRuntimeSeconds": 0}, "spec.expectedRuntimeSeconds: Input should be greater than or equal to 1"),
    ({"expectedRuntimeSeconds": "1h"}, "spec.expectedRuntimeSeconds: Input should be a valid integer"),
    ({"expectedRuntimeSeconds": 2**31}, "spec.expectedRuntimeSeconds: Input should be less than or equal to"),
])
def test_bad_specs_name_the_field(spec, problem):
    with pytest.raises(ValueError, match=problem):
        parse_spec(spec)


def test_unknown_fields_are_ignored_for_forward_compatibility():
    assert parse_spec({"minMember": 2, "someFutureField": True}).min_member == 2


QUEUE_CRD = yaml.safe_load((Path(__file__).resolve().parents[2] / "crds" / "queue.yaml").read_text())
QUEUE_SCHEMA = QUEUE_CRD["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]


def test_queue_spec_and_status_fields_are_the_crds():
    assert {f.alias or n for n, f in QueueSpec.model_fields.items()} == set(QUEUE_SCHEMA["spec"]["properties"])
    assert {f.alias or n for n, f in QueueStatus.model_fields.items()} == set(QUEUE_SCHEMA["status"]["properties"])
    for field in ("resources", "gpuTypes"):
        quota = QUEUE_SCHEMA["spec"]["properties"][field]["additionalProperties"]["properties"]
        assert set(quota) == set(ResourceQuota.model_fields)
    assert QUEUE_CRD["spec"]["scope"] == "Cluster" and QUEUE_CRD["spec"]["versions"][0]["subresources"] == \
        {"status": {}}


def test_queue_printer_columns_read_fields_of_the_schema():
    for column in QUEUE_CRD["spec"]["versions"][0]["additionalPrinterColumns"]:
        top, field = column["jsonPath"].split(".")[1:3]
        assert top == "metadata" or field in QUEUE_SCHEMA[top]["properties"], column


def test_a_queue_round_trips_through_its_json():
    queue = Queue(metadata=QueueMeta(name="team-a"),
                  spec=QueueSpec(parent="org", resources={"nvidia.com/gpu": ResourceQuota(guaranteed=8, limit=16)}))
    assert queue.to_json()["spec"] == {"parent": "org", "weight": 1.0, "reclaimable": True,
                                       "resources": {"nvidia.com/gpu": {"guaranteed": 8, "limit": 16}},
                                       "gpuTypes": {}}
    assert queue_from_json(queue.to_json()).limits() == {"nvidia.com/gpu": 16}
