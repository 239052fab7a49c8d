"""Public traces as simulator input (docs/simulator.md, "Traces"); the files
are read where they are (``--trace-dir``, else ``$BATCHSCHED_TRACE_DIR``,
else ``./traces``), never copied into the project.

``alibaba``  the Alibaba GPU cluster trace v2023 (alibaba-v2023/): the GPU
             node list becomes the cluster, the default pod list's GPU pods
             the jobs -- one pod each, by creation time, lasting their trace
             lifetime.
``philly``   the Philly-derived job mix of Pollux (pollux-workload-via-blox/
             workload-6.csv): 160 training jobs with their submission times
             and GPU counts, on the cluster of ``--cluster`` (else the
             embedded default).
"""
from __future__ import annotations

import math
import os
import random
import statistics
from pathlib import Path

from batchsched.sim.cluster import NodeGroup, builtin_topologies
from batchsched.sim.files import InputError, Record, read_csv
from batchsched.sim.workload import Job

ALIBABA_DIR = "alibaba-v2023"
ALIBABA_NODES = "openb_node_list_gpu_node.csv"
ALIBABA_PODS = "openb_pod_list_default.csv"
PHILLY_DIR = "pollux-workload-via-blox"
PHILLY_JOBS = "workload-6.csv"

GPU_MODEL_LABEL = "alibaba.com/gpu-model"
# The trace has no topology.  V100 8-GPU servers are DGX-1-like; the other
# 8-GPU models (G2, G3 are undisclosed) take the built-in 8-GPU boards in turn.
_EIGHT_GPU_BOARDS = ("dgx1-v100", "dgx-a100", "dgx-h100", "pcie-8gpu")
_SMALL_BOARDS = {4: "pcie-4gpu", 2: "pcie-2gpu"}
# QoS class -> pod priority: latency-sensitive and guaranteed first, best effort last.
_QOS_PRIORITY = {"LS": 1000, "Guaranteed": 1000, "Burstable": 500, "BE": 0}
# The arrival rate is chosen so that the pods that would still run at the
# last arrival, had each started on arrival, ask for this share of the GPUs.
OFFERED_LOAD = 1.0

# Philly-derived jobs carry no duration (Pollux models it from throughput):
# log-normal, median 2 h, sigma 0.8, within 5 min .. 24 h.
_PHILLY_MEDIAN, _PHILLY_SIGMA, _PHILLY_RANGE = 7200.0, 0.8, (300.0, 86400.0)
# The trace has no runtime estimates: each job's PodGroup states one this
# multiple of its drawn duration, as a user overestimating it would
# (expectedRuntimeSeconds, docs/queueing.md "Backfill").
PHILLY_RUNTIME_HINT = 1.5
GPUS_PER_NODE = 8


TRACE_DIR_ENV = "BATCHSCHED_TRACE_DIR"


def default_trace_dir() -> Path:
    """$BATCHSCHED_TRACE_DIR, else ./traces: nothing relative to the package, which may be installed anywhere."""
    return Path(os.environ.get(TRACE_DIR_ENV) or "traces")


def trace_file(trace_dir: Path, folder: str, name: str) -> Path:
    path = trace_dir / folder / name
    if not path.is_file():
        raise InputError(f"{path}: no such file; --trace-dir (else ${TRACE_DIR_ENV}, else ./traces) must name "
                         f"the folder holding {folder}/{name} (docs/simulator.md, \"Traces\", says where to get it)")
    return path


# --------------------------------------------------------------------------
# Alibaba v2023
# --------------------------------------------------------------------------


def alibaba(trace_dir: Path, max_pods: int | None = None, seed: int = 1) -> tuple[list[NodeGroup], list[Job]]:
    """The Alibaba cluster and its GPU pods.

    Pods arrive in creation order, evenly spaced, at the rate at which the
    pods still running at the last arrival, had each started on arrival,
    would ask for as many GPUs as the cluster has (``OFFERED_LOAD``): the
    cluster fills as arrivals end, as in the trace's own study.  (The
    trace's creation times spread its 7064 GPU pods over 149 days, which
    would keep at most 71 of the 6212 GPUs busy: the pod list samples a
    larger cluster's pods.)  Each lasts its trace
    lifetime (deletion - scheduled time; pods the trace never scheduled,
    the median).  A fractional GPU (gpu_milli < 1000) takes a whole one,
    as batchsched hands out whole GPUs; CPU-only pods are left out (they
    would run on the CPU nodes the GPU node list omits).  ``max_pods``
    keeps a seeded sample of the pods and as large a share of each GPU
    model's nodes, so the load stays the same.
    """
    nodes = list(read_csv(trace_file(trace_dir, ALIBABA_DIR, ALIBABA_NODES),
                          {"sn", "cpu_milli", "memory_mib", "gpu", "model"},
                          {"sn", "cpu_milli", "memory_mib", "gpu", "model"}))
    rows = [r for r in read_csv(trace_file(trace_dir, ALIBABA_DIR, ALIBABA_PODS), _ALIBABA_POD_COLUMNS,
                                _ALIBABA_POD_COLUMNS) if r.integer("num_gpu") > 0]
    rows.sort(key=lambda r: (r.integer("creation_time"), r["name"]))
    if max_pods is not None and max_pods < len(rows):
        rng = random.Random(seed)
        share = max_pods / len(rows)
        rows = sorted(rng.sample(rows, max_pods), key=lambda r: (r.integer("creation_time"), r["name"]))
        nodes = _sample_by_model(nodes, share, rng)
    groups = [_alibaba_node(r, k) for k, r in enumerate(nodes)]
    lifetimes = [r.integer("deletion_time") - r.integer("scheduled_time") for r in rows if r["scheduled_time"]]
    typical = statistics.median(lifetimes) if lifetimes else 600.0
    durations = [float(r.integer("deletion_time") - r.integer("scheduled_time")) if r["scheduled_time"]
                 else typical for r in rows]
    gpus = [r.integer("num_gpu") for r in rows]
    spacing = arrival_spacing(gpus, durations, sum(g.gpus * g.count for g in groups) * OFFERED_LOAD)
    jobs = [_alibaba_job(r, i * spacing, d) for i, (r, d) in enumerate(zip(rows, durations))]
    return groups, jobs


_ALIBABA_POD_COLUMNS = {"name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "gpu_spec", "qos",
                        "pod_phase", "creation_time", "deletion_time", "scheduled_time"}


def _sample_by_model(nodes: list[Record], share: float, rng: random.Random) -> list[Record]:
    by_model: dict[tuple[str, str], list[Record]] = {}
    for node in nodes:
        by_model.setdefault((node["model"], node["gpu"]), []).append(node)
    kept = []
    for members in by_model.values():
        kept += rng.sample(members, max(1, round(len(members) * share)))
    return sorted(kept, key=lambda r: r["sn"])


def _alibaba_node(record: Record, index: int) -> NodeGroup:
    gpus, model = record.integer("gpu"), record.text("model")
    if gpus == GPUS_PER_NODE:
        board = "dgx1-v100" if model.startswith("V100") else _EIGHT_GPU_BOARDS[index % len(_EIGHT_GPU_BOARDS)]
    else:
        board = _SMALL_BOARDS.get(gpus, "")
    return NodeGroup(name=record.text("sn"), gpus=gpus, cpu=f"{record.integer('cpu_milli')}m",
                     memory=f"{record.integer('memory_mib')}Mi",
                     topology=builtin_topologies()[board] if board else None, topology_name=board or "none",
                     labels={GPU_MODEL_LABEL: model})


def _alibaba_job(record: Record, arrival: float, duration: float) -> Job:
    allowed = tuple(m for m in record.get("gpu_spec", "").split("|") if m)
    return Job(name=record.text("name"), arrival=round(arrival, 3), duration=duration,
               gpus=record.integer("num_gpu"), cpu=f"{record.integer('cpu_milli')}m",
               memory=f"{record.integer('memory_mib')}Mi",
               priority=_QOS_PRIORITY.get(record.get("qos", ""), 0), namespace="alibaba",
               labels={"qos": record.get("qos", "")},
               node_affinity=((GPU_MODEL_LABEL, allowed),) if allowed else ())


def arrival_spacing(gpus: list[int], durations: list[float], target_gpus: float) -> float:
    """The spacing s of evenly spaced arrivals (pod i at i*s) at which the
    pods that would still run at the last arrival, had each started on
    arrival, ask for ``target_gpus`` GPUs (0 when all of them together ask
    for no more)."""
    n = len(gpus)
    if n < 2 or sum(gpus) <= target_gpus:
        return 0.0

    def running_at_end(spacing: float) -> int:
        return sum(g for i, (g, d) in enumerate(zip(gpus, durations)) if d > (n - 1 - i) * spacing)

    low, high = 0.0, max(durations)  # running_at_end falls as the spacing grows
    for _ in range(60):
        middle = (low + high) / 2
        low, high = (middle, high) if running_at_end(middle) > target_gpus else (low, middle)
    return high


# --------------------------------------------------------------------------
# Philly-derived (Pollux workload-6)
# --------------------------------------------------------------------------


def philly(trace_dir: Path, seed: int = 1) -> list[Job]:
    """Each job's GPUs (num_replicas, one per replica) as a gang of
    ceil(GPUs / 8) pods of equal GPUs when that divides evenly, else one
    pod per GPU; its submission time as arrival; a drawn duration, and a
    runtime hint ``PHILLY_RUNTIME_HINT`` times it."""
    rng = random.Random(seed)
    columns = {"name", "time", "application", "num_replicas", "batch_size"}
    jobs = []
    for record in read_csv(trace_file(trace_dir, PHILLY_DIR, PHILLY_JOBS), columns, columns):
        replicas = record.integer("num_replicas", minimum=1)
        pods = math.ceil(replicas / GPUS_PER_NODE)
        if replicas % pods:
            pods = replicas
        duration = min(max(rng.lognormvariate(math.log(_PHILLY_MEDIAN), _PHILLY_SIGMA), _PHILLY_RANGE[0]),
                       _PHILLY_RANGE[1])
        jobs.append(Job(name=record.text("name"), arrival=record.seconds("time"), duration=round(duration),
                        pods=pods, min_member=pods, gpus=replicas // pods, cpu="8", memory="64Gi",
                        priority=1000, priority_class="training", namespace="philly",
                        labels={"application": record.text("application")}, runtime_hint=PHILLY_RUNTIME_HINT))
    return sorted(jobs, key=lambda j: (j.arrival, j.name))
