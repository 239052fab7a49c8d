"""Which GPUs each pod really holds, against the ids batchsched chose (pure).

The kubelet's PodResources API says which devices every container got:
``nvidia.com/gpu`` device ids (GPU uuids with NVIDIA's device plugin, ``uuid::n``
for a time-sliced replica, or indices with its ``index`` id strategy) and DRA
devices (driver, pool, device), mapped to the topology's GPUs through the
node's ResourceSlices as the scheduler maps them (core/dra/inventory.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping

from batchsched.api import constants
from batchsched.core.dra.inventory import NodeDra
from batchsched.core.readers import parse_gpu_ids
from batchsched.core.text import clip
from batchsched.core.topology.model import GpuTopology


@dataclass(frozen=True)
class Held:
    """What one pod's containers hold, all containers together."""
    device_ids: tuple[str, ...] = ()  # nvidia.com/gpu device ids
    dra_devices: tuple[tuple[str, str, str], ...] = ()  # (driver, pool, device)


@dataclass(frozen=True)
class Finding:
    namespace: str
    name: str
    uid: str
    planned: tuple[int, ...]  # the pod's gpu-ids
    actual: tuple[int, ...]  # the topology indices it holds
    unknown: tuple[str, ...]  # devices it holds that are no GPU of the topology
    recorded: str  # its gpu-ids-actual annotation now ("" when absent)

    @property
    def mismatch(self) -> bool:
        return self.planned != self.actual or bool(self.unknown)

    @property
    def actual_text(self) -> str:
        return ",".join(map(str, self.actual))

    def message(self) -> str:
        text = (f"batchsched chose GPUs {','.join(map(str, self.planned)) or 'none'} but the kubelet gave "
                f"{self.actual_text or 'none'}")
        if self.unknown:
            text += f", and devices that are no GPU of the node's topology: {clip(', '.join(self.unknown), 200)}"
        return text + f" (recorded in {constants.GPU_IDS_ACTUAL_ANNOTATION})"


def verify(pods: Iterable[Mapping], held: Mapping[tuple[str, str], Held], topology: GpuTopology,
           dra: NodeDra | None = None) -> list[Finding]:
    """One finding per pod that batchsched gave GPU ids (a gpu-ids annotation)
    and the kubelet reports; pods it does not report yet say nothing."""
    by_uuid = {g.uuid: g.index for g in topology.gpus if g.uuid}
    by_dra = {g.key: g.index for g in (dra.gpus if dra else ()) if g.index is not None}
    findings = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        annotations = meta.get("annotations") or {}
        key = (meta.get("namespace", ""), meta.get("name", ""))
        if constants.GPU_IDS_ANNOTATION not in annotations or key not in held:
            continue
        actual, unknown = set(), []
        devices = [(d, _index(d, by_uuid, len(topology))) for d in held[key].device_ids]
        devices += [("/".join(d), by_dra.get(d)) for d in held[key].dra_devices]
        for name, index in devices:
            if index is None:
                unknown.append(name)
            else:
                actual.add(index)
        findings.append(Finding(key[0], key[1], meta.get("uid", ""),
                                parse_gpu_ids(annotations.get(constants.GPU_IDS_ANNOTATION)),
                                tuple(sorted(actual)), tuple(unknown),
                                str(annotations.get(constants.GPU_IDS_ACTUAL_ANNOTATION, ""))))
    return findings


def _index(device_id: str, by_uuid: Mapping[str, int], count: int) -> int | None:
    uuid = device_id.split("::", 1)[0]  # a time-sliced replica: uuid::n
    if uuid in by_uuid:
        return by_uuid[uuid]
    if uuid.isascii() and uuid.isdigit() and int(uuid) < count:  # the plugin's index id strategy
        return int(uuid)
    return None
