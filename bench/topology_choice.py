"""Which GPUs of a node a pod gets: batchsched against the baselines, on the
real `nvidia-smi topo -m` captures and the Alibaba v2023 trace in ../shared.

    .venv/bin/python bench/topology_choice.py [--samples 300] [--seed 1]

Contenders, all measured in the same run on the same inputs:

* random    -- the kubelet without topology hints: k random free GPUs;
* lowest    -- the k lowest free indices;
* nvidia-dp -- the NVIDIA device plugin's best-effort allocator as publicly
               described: a pair scores 100 per NVLink link, else SYS 10,
               NODE 20, PHB 30, PXB 40, PIX 50; a set scores the sum of its
               pairs; it takes the best-scoring partition of the free GPUs
               into groups of k (padded), then that partition's best group,
               the first found winning ties, with the kubelet listing the
               devices in random order;
* batchsched -- batchsched.core.topology.choose.choose_gpus.

1. Static quality: every capture, every k >= 2, ``--samples`` random free
   sets per k (size uniform in k..n).  Per contender: share of picks with
   the optimal (worst link, aggregate bandwidth), mean worst-link rank
   (SYS 1, NODE 2, PHB 3, PXB 4, PIX 5, NV<n> 5+n), share split across NUMA
   nodes when one would do.
2. Fragmentation: the Alibaba v2023 GPU nodes (1213 nodes, 6212 GPUs), each
   given a real topology of its GPU count (8: the five 8-GPU captures in
   turn, 4: the two 4-GPU ones, 2: the PHB pair), and the trace's GPU pods
   in a seeded random order (the trace lists them by creation) until the
   cluster is full, as in the trace's own study (Weng et al., ATC'23);
   fractional-GPU pods take a whole GPU, as batchsched hands out whole
   GPUs.  The node is chosen alike for every in-node contender, once by
   best fit (fewest GPUs left, then lowest index: batchsched's packing) and
   once by spreading (most GPUs left: kube-scheduler's LeastAllocated
   default, which leaves many nodes partly used); "batchsched planner" is
   the real gang planner (set quality first, then packing).  Reported: for
   multi-GPU pods, the share placed on a set as good as their node type
   offers when empty and the mean worst-link rank; and the *ideal room*
   when 75% and 90% of the GPUs are allocated: on partly used nodes, how
   many 2- (4-) GPU pods the free GPUs still take on sets as good as on an
   empty node (greedily), against how many they take by count alone.
3. Cost: per-decision time of choose_gpus and of the planner's pick_gpus,
   warm (cached) and cold, on 8- and 16-GPU nodes.
"""
from __future__ import annotations

import argparse
import csv
import random
import statistics
import sys
import time
from itertools import combinations
from pathlib import Path
from typing import Callable

from sortedcontainers import SortedList

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from batchsched.api import constants  # noqa: E402
from batchsched.core.model import PodInfo, TopologyPolicy
from batchsched.core.readers import node_from_json
from batchsched.core.placement.capacity import CapacityIndex  # noqa: E402
from batchsched.core.placement.gang import GangPlan, plan_gang  # noqa: E402
from batchsched.core.placement.gpus import pick_gpus  # noqa: E402
from batchsched.core.topology.accounting import GpuRoom, numa_capacity  # noqa: E402
from batchsched.core.topology.annotation import to_annotation  # noqa: E402
from batchsched.core.topology.choose import choose_gpus, evaluate, gpus_of, mask_of  # noqa: E402
from batchsched.core.topology.model import GpuTopology, link_name  # noqa: E402
from batchsched.core.topology.parse import parse_topo  # noqa: E402
from batchsched.sim.progress import TerminalProgress  # noqa: E402

SHARED = ROOT.parent / "shared" / "data"
TOPOLOGIES = SHARED / "topologies"
TRACE = SHARED / "traces" / "alibaba-v2023"
FIXTURES = ROOT / "tests" / "fixtures" / "topologies"
BY_SIZE = {
    8: ["dgx1-v100-8gpu-nv1-nv2-mlx5-ucxpy.txt", "baobab-8x-rtx-a6000-nv4-pairs-2numa.txt",
        "dgx-a100-8gpu-nv12-10nic-multinuma.txt", "h100-sxm-8gpu-nv18-2numa-mlengineering.txt",
        "pcie-8gpu-pix-node-sys-2numa-johnsblog.txt"],
    4: ["titan-rtx-4gpu-nvlink-bridge-pairs-1socket.txt", "asus-esc8000a-e12-4x-rtx6000ada-pcie-2numa.txt"],
    2: ["puget-wrx90-2x-rtx6000ada-phb.txt"],
}
PCIE_SCORE = {"SYS": 10, "NODE": 20, "PHB": 30, "PXB": 40, "PIX": 50}


# ---- the contenders: (topology, free mask, k, rng) -> GPU tuple ----------------------------


def pick_random(topology, free, k, rng):
    return tuple(sorted(rng.sample(gpus_of(free), k)))


def pick_lowest(topology, free, k, rng):
    return gpus_of(free)[:k]


def pick_device_plugin(topology, free, k, rng):
    devices = list(gpus_of(free))
    rng.shuffle(devices)  # the kubelet hands the device plugin its devices in map order
    if k == 1:
        return (devices[0],)  # every partition scores 0: the first found wins
    pads = -len(devices) % k
    devices += [None] * pads  # padded to a multiple of k, all padding in one group

    def pair(a, b):
        if a is None or b is None:
            return 0
        link = topology.link(a, b)
        return 100 * link.nvlinks if link.is_nvlink else PCIE_SCORE[link.kind]

    def score(group):
        return sum(pair(a, b) for a, b in combinations(group, 2))

    def partitions(rest):
        if not rest:
            yield []
            return
        for others in combinations(range(1, len(rest)), k - 1):
            group = [rest[0]] + [rest[i] for i in others]
            if group.count(None) not in (0, pads):
                continue
            remaining = [d for i, d in enumerate(rest[1:], 1) if i not in others]
            for tail in partitions(remaining):
                yield [group] + tail

    best, best_score = None, -1
    for partition in partitions(devices):
        total = sum(score(g) for g in partition)
        if total > best_score:  # the first found wins ties
            best, best_score = partition, total
    full = [g for g in best if None not in g]  # a padded group would hand out fewer than k GPUs
    return tuple(sorted(max(full, key=score)))  # max keeps the first of equal scores


def pick_batchsched(topology, free, k, rng):
    return choose_gpus(topology, free, k).gpus


CONTENDERS = {"random": pick_random, "lowest": pick_lowest, "nvidia-dp": pick_device_plugin,
              "batchsched": pick_batchsched}


def read(name: str) -> GpuTopology:
    return parse_topo((TOPOLOGIES / name).read_text())


def comm(topology, gpus, free) -> tuple[int, int]:
    choice = evaluate(topology, gpus, free)
    return choice.worst, choice.gbps


# ---- 1. static quality -----------------------------------------------------------------


def static_quality(samples: int, seed: int) -> list[str]:
    names = sorted(p.name for p in TOPOLOGIES.glob("*.txt"))
    totals = {c: [0, 0, 0, 0] for c in CONTENDERS}  # optimal, picks, worst-rank sum, NUMA nodes sum
    rows = ["| topology | picks | " + " | ".join(f"{c} optimal / mean worst" for c in CONTENDERS) + " |",
            "|---|---:|" + "---|" * len(CONTENDERS)]
    for name in names:
        topology = read(name)
        n = len(topology)
        rng = random.Random(f"{seed}-{name}")
        stats = {c: [0, 0, 0, 0] for c in CONTENDERS}
        for k in range(2, n + 1):
            for _ in range(samples):
                free = mask_of(rng.sample(range(n), rng.randint(k, n)))
                best = comm(topology, choose_gpus(topology, free, k).gpus, free)
                for contender, pick in CONTENDERS.items():
                    got = evaluate(topology, pick(topology, free, k, rng), free)
                    s = stats[contender]
                    s[0] += (got.worst, got.gbps) == best
                    s[1] += 1
                    s[2] += got.worst
                    s[3] += got.numa_nodes
        cells = []
        for contender in CONTENDERS:
            optimal, picks, ranks, _ = stats[contender]
            cells.append(f"{100 * optimal / picks:.1f}% / {ranks / picks:.2f}")
            for i in range(4):
                totals[contender][i] += stats[contender][i]
        rows.append(f"| {name.removesuffix('.txt')} | {stats['random'][1]} | " + " | ".join(cells) + " |")
    cells = [f"**{100 * t[0] / t[1]:.1f}% / {t[2] / t[1]:.2f}**" for t in totals.values()]
    rows.append(f"| **all** | {totals['random'][1]} | " + " | ".join(cells) + " |")
    rows.append("")
    rows.append("Mean NUMA nodes a set spans, all topologies: " + ", ".join(
        f"{c} {t[3] / t[1]:.3f}" for c, t in totals.items()))
    return rows


# ---- 2. fragmentation on the Alibaba v2023 trace -------------------------------------------


class Cluster:
    def __init__(self):
        self.nodes = []  # (name, gpus, cpu milli, memory MiB, topology or None)
        rotation = {size: 0 for size in BY_SIZE}
        topologies = {name: read(name) for names in BY_SIZE.values() for name in names}
        with open(TRACE / "openb_node_list_gpu_node.csv") as f:
            for row in csv.DictReader(f):
                gpus = int(row["gpu"])
                topology = None
                if gpus in BY_SIZE:
                    names = BY_SIZE[gpus]
                    topology = topologies[names[rotation[gpus] % len(names)]]
                    rotation[gpus] += 1
                self.nodes.append((row["sn"], gpus, int(row["cpu_milli"]), int(row["memory_mib"]), topology))
        self.total_gpus = sum(n[1] for n in self.nodes)
        self.ideal = {}  # (topology, k) -> (worst, gbps) on the empty node
        for _, gpus, _, _, topology in self.nodes:
            if topology is not None:
                for k in range(2, gpus + 1):
                    everyone = (1 << gpus) - 1
                    self.ideal[topology, k] = comm(topology, choose_gpus(topology, everyone, k).gpus, everyone)


def trace_pods(variant: str, seed: int) -> list[tuple[int, int, int]]:
    """(GPUs, cpu milli, memory MiB) of the trace's GPU pods, shuffled."""
    with open(TRACE / f"openb_pod_list_{variant}.csv") as f:
        pods = [(int(r["num_gpu"]), int(r["cpu_milli"]), int(r["memory_mib"]))
                for r in csv.DictReader(f) if int(r["num_gpu"]) > 0]
    random.Random(seed).shuffle(pods)
    return pods


class Replay:
    MILESTONES = (0.75, 0.9)
    ROOM_SIZES = (2, 4)

    def __init__(self, cluster: Cluster):
        self.cluster = cluster
        self.free = [(1 << n[1]) - 1 for n in cluster.nodes]
        self.cpu = [n[2] for n in cluster.nodes]
        self.memory = [n[3] for n in cluster.nodes]
        self.allocated = 0
        self.placed = self.failed = 0
        self.multi = self.ideal = 0
        self.rank_sum = 0
        self.room: dict[tuple[float, int], tuple[int, int]] = {}  # (milestone, k) -> (ideal, by count)

    def record(self, index: int, gpus: tuple[int, ...], cpu: int, memory: int) -> None:
        name, count, _, _, topology = self.cluster.nodes[index]
        before = self.free[index]
        self.free[index] &= ~mask_of(gpus)
        self.cpu[index] -= cpu
        self.memory[index] -= memory
        self.allocated += len(gpus)
        self.placed += 1
        if len(gpus) > 1 and topology is not None:
            got = comm(topology, gpus, before)
            self.multi += 1
            self.ideal += got == self.cluster.ideal[topology, len(gpus)]
            self.rank_sum += got[0]
        for milestone in self.MILESTONES:
            if (milestone, 2) not in self.room and self.allocated >= milestone * self.cluster.total_gpus:
                for k in self.ROOM_SIZES:
                    self.room[milestone, k] = self.ideal_room(k)

    def ideal_room(self, k: int) -> tuple[int, int]:
        ideal = by_count = 0
        for (_, count, _, _, topology), free in zip(self.cluster.nodes, self.free):
            if topology is None or count < k or free in (0, (1 << count) - 1):
                continue  # whole free nodes offer ideal sets whatever the chooser did
            by_count += free.bit_count() // k
            while free.bit_count() >= k:
                choice = choose_gpus(topology, free, k)
                if (choice.worst, choice.gbps) != self.cluster.ideal[topology, k]:
                    break
                ideal += 1
                free &= ~mask_of(choice.gpus)
        return ideal, by_count

    def row(self, label: str, seconds: float) -> str:
        room = " | ".join("{} / {}".format(*self.room.get((m, k), ("-", "-")))
                          for m in self.MILESTONES for k in self.ROOM_SIZES)
        return (f"| {label} | {self.placed} | {self.allocated} | {100 * self.ideal / max(1, self.multi):.1f}% | "
                f"{self.rank_sum / max(1, self.multi):.2f} | {room} | {seconds:.1f} |")


def replay_in_node(cluster: Cluster, pods, contender: str, seed: int, spread: bool,
                   progress: Callable[[int, Replay], None] = lambda step, replay: None) -> Replay:
    """The node choice every in-node contender shares: best fit, or spread;
    ``progress`` is told each step."""
    replay = Replay(cluster)
    rng = random.Random(seed)
    pick = CONTENDERS[contender]
    buckets = {}  # free GPUs -> node indices
    for index, free in enumerate(replay.free):
        buckets.setdefault(free.bit_count(), SortedList()).add(index)
    for step, (k, cpu, memory) in enumerate(pods):
        progress(step, replay)
        index = next((i for count in sorted((c for c in buckets if c >= k), reverse=spread) for i in buckets[count]
                      if replay.cpu[i] >= cpu and replay.memory[i] >= memory), None)
        if index is None:
            replay.failed += 1
            continue
        topology = cluster.nodes[index][4]
        free = replay.free[index]
        gpus = pick(topology, free, k, rng) if topology is not None else gpus_of(free)[:k]
        buckets[free.bit_count()].remove(index)
        replay.record(index, gpus, cpu, memory)
        buckets.setdefault(replay.free[index].bit_count(), SortedList()).add(index)
    return replay


def replay_planner(cluster: Cluster, pods,
                   progress: Callable[[int, Replay], None] = lambda step, replay: None) -> Replay:
    """The real gang planner, each trace pod a gang of one; ``progress`` is told each step."""
    replay = Replay(cluster)
    nodes, free, rooms = {}, {}, {}
    for name, gpus, cpu, memory, topology in cluster.nodes:
        annotations = {constants.GPU_TOPOLOGY_ANNOTATION: to_annotation(topology)} if topology else {}
        nodes[name] = node_from_json({
            "metadata": {"name": name, "annotations": annotations},
            "status": {"allocatable": {"cpu": f"{cpu}m", "memory": f"{memory}Mi", "pods": "1000",
                                       constants.GPU_RESOURCE: str(gpus)},
                       "conditions": [{"type": "Ready", "status": "True"}]}})
        free[name] = dict(nodes[name].allocatable)
        rooms[name] = GpuRoom((1 << gpus) - 1, numa_capacity(nodes[name]), numa_capacity(nodes[name]))
    index_of = {n[0]: i for i, n in enumerate(cluster.nodes)}
    capacity = CapacityIndex(nodes, free, rooms=rooms)
    for number, (k, cpu, memory) in enumerate(pods):
        progress(number, replay)
        pod = PodInfo(uid=str(number), namespace="trace", name=f"p{number}",
                      requests={"cpu": cpu, "memory": memory * 2**20, "pods": 1, constants.GPU_RESOURCE: k})
        result = plan_gang([pod], 1, capacity)
        if not isinstance(result, GangPlan):
            replay.failed += 1
            continue
        assignment = result.assignments[0]
        replay.record(index_of[assignment.node_name], assignment.gpu_ids, cpu, memory)
    return replay


def shown(terminal: TerminalProgress | None, phase: str, total: int) -> Callable[[int, Replay], None]:
    """A replay's progress on the terminal (nothing when stderr is not one)."""
    if terminal is None:
        return lambda step, replay: None
    return lambda step, replay: terminal.show(phase, f"pod {step}", step - replay.failed, total, "pods placed")


def fragmentation(seed: int) -> list[str]:
    cluster = Cluster()
    terminal = TerminalProgress.if_terminal(sys.stderr)
    rows = []
    for variant in ("default", "multigpu50"):
        pods = trace_pods(variant, seed)
        rows += [f"Trace `openb_pod_list_{variant}.csv`: {len(pods)} GPU pods "
                 f"({sum(p[0] for p in pods)} GPUs asked; the cluster has {cluster.total_gpus}).", "",
                 "| node choice | GPU choice | pods placed | GPUs allocated | multi-GPU pods on an ideal set | "
                 "mean worst-link rank | ideal room 2-GPU @75% | 4-GPU @75% | 2-GPU @90% | 4-GPU @90% | seconds |",
                 "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for spread in (False, True):
            for contender in CONTENDERS:
                started = time.perf_counter()
                node_choice = "spread" if spread else "best fit"
                replay = replay_in_node(cluster, pods, contender, seed, spread,
                                        shown(terminal, f"{variant}, {node_choice}, {contender}", len(pods)))
                rows.append(replay.row(f"{'spread' if spread else 'best fit'} | {contender}",
                                       time.perf_counter() - started))
        started = time.perf_counter()
        replay = replay_planner(cluster, pods, shown(terminal, f"{variant}, batchsched planner", len(pods)))
        rows.append(replay.row("batchsched planner | batchsched", time.perf_counter() - started))
        if terminal is not None:
            terminal.done()
        rows.append("")
    return rows


# ---- 3. cost -----------------------------------------------------------------------------


def microseconds(call, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter_ns()
        call()
        times.append(time.perf_counter_ns() - started)
    return statistics.median(times) / 1000


def cost() -> list[str]:
    rows = ["| topology | GPUs | warm choose_gpus (median µs) | warm pick_gpus (median µs) | "
            "cold choose_gpus, median / worst over k (µs) |", "|---|---:|---:|---:|---:|"]
    cases = [(name, (TOPOLOGIES / name).read_text()) for name in BY_SIZE[8]]
    cases += [(p.name, p.read_text()) for p in sorted(FIXTURES.glob("synthetic-*16gpu*.txt"))]
    policy = TopologyPolicy()
    for name, text in cases:
        topology = parse_topo(text)
        n = len(topology)
        node = node_from_json({"metadata": {"name": "n", "annotations": {
            constants.GPU_TOPOLOGY_ANNOTATION: to_annotation(topology)}},
            "status": {"allocatable": {"cpu": "64", "memory": "512Gi", constants.GPU_RESOURCE: str(n)}}})
        rng = random.Random(n)
        states = [(mask_of(rng.sample(range(n), rng.randint(2, n))), 2) for _ in range(200)]
        for free, k in states:
            choose_gpus(topology, free, k)  # warm the cache
        rooms = [(GpuRoom(free, {}, {}), k) for free, k in states]
        warm = statistics.median(microseconds(lambda f=f, k=k: choose_gpus(topology, f, k), 5) for f, k in states)
        warm_pick = statistics.median(microseconds(
            lambda r=r, k=k: pick_gpus(node, r, {constants.GPU_RESOURCE: k}, policy), 5) for r, k in rooms)
        cold = []
        for k in range(2, n + 1):
            fresh = parse_topo(text)  # a new object: an empty cache
            cold.append(microseconds(lambda k=k, t=fresh: choose_gpus(t, (1 << n) - 1, k), 1))
        rows.append(f"| {name.removesuffix('.txt')} | {n} | {warm:.2f} | {warm_pick:.2f} | "
                    f"{statistics.median(cold):.0f} / {max(cold):.0f} |")
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samples", type=int, default=300, help="random free sets per topology and k")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    if not TOPOLOGIES.is_dir() or not TRACE.is_dir():
        print(f"needs the captures and the trace under {SHARED}", file=sys.stderr)
        return 1
    started = time.perf_counter()
    print(f"Worst-link ranks: {', '.join(f'{r} {link_name(r)}' for r in range(1, 8))}, ... (NV<n> = 5+n)\n")
    print("## Static quality\n")
    print("\n".join(static_quality(args.samples, args.seed)))
    print("\n## Fragmentation on the Alibaba v2023 trace\n")
    print("\n".join(fragmentation(args.seed)))
    print("## Cost per decision\n")
    print("\n".join(cost()))
    print(f"\n(total {time.perf_counter() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
