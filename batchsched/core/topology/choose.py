"""Which k of a node's free GPUs a pod gets.

The objective, compared left to right, higher is better (docs/topology.md):

1. the worst link inside the set, by class rank (so a set joined by NVLink
   everywhere beats any set with a PCIe pair, NV2 everywhere beats NV1 ...);
2. the aggregate bandwidth of the set: the estimates summed over its pairs;
3. fewer NUMA nodes (GPUs of unknown NUMA node do not count);
4. the aggregate bandwidth among the free GPUs the set leaves behind, so
   what remains stays as well connected as possible (less fragmentation);
5. then the lowest indices (the sorted tuple), so the answer is unique.

``choose_gpus`` is exact.  It first finds the best worst link that any
k-subset reaches (a k-clique over links of that class or better,
``has_clique``), then searches only the sets whose every pair is that
good.  GPUs that are interchangeable -- same NUMA node and the same link to
every other free GPU (the halves of an NVSwitch board, the two GPUs under
one PCIe switch) -- are searched as one class, taking the lowest indices of
a class first; this is what keeps 16-GPU nodes cheap.  Answers are cached
by (topology, free set, k, allowed set).  ``choose_exhaustive`` computes
the same answer by brute force and exists for the tests.

Sets are bit masks: GPU i is bit i.
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations
from math import comb


from batchsched.core.topology.model import GpuTopology

NO_LINK = 1 << 20  # the worst link of a single GPU: every 1-GPU set ties on it
CACHE_SIZE = 100_000  # answers kept per topology


@dataclass(frozen=True)
class GpuChoice:
    gpus: tuple[int, ...]
    worst: int  # rank of the worst link inside the set (NO_LINK for one GPU)
    gbps: int  # summed over the pairs inside the set
    numa_nodes: int  # distinct known NUMA nodes of the set, at least 1
    leftover_gbps: int  # summed over the pairs of free GPUs left

    @property
    def objective(self) -> tuple[int, int, int, int]:
        """Higher is better, compared left to right."""
        return (self.worst, self.gbps, -self.numa_nodes, self.leftover_gbps)


def mask_of(gpus) -> int:
    mask = 0
    for gpu in gpus:
        mask |= 1 << gpu
    return mask


def gpus_of(mask: int) -> tuple[int, ...]:
    return tuple(i for i in range(mask.bit_length()) if mask >> i & 1)


def has_clique(linked: list[int], among: int, k: int) -> bool:
    """Whether ``k`` GPUs of ``among`` are pairwise linked (``linked[i]``:
    the GPUs linked to GPU i).  Exact: the highest GPU left is either in
    such a set, with k - 1 of its linked ones, or not.  A topology has at
    most MAX_GPUS (16) GPUs, so at most 2**16 branches (0.1 ms for the
    hardest 16-GPU graph, a complete 4-partite one, where networkx took
    0.7 ms); and no import (networkx: ~0.1 s) lands in the first cycle."""
    if k <= 0:
        return True
    while among.bit_count() >= k:
        gpu = among.bit_length() - 1
        among &= ~(1 << gpu)
        if has_clique(linked, among & linked[gpu], k - 1):
            return True
    return False


def choose_gpus(topology: GpuTopology, free: int, k: int, allowed: int | None = None) -> GpuChoice | None:
    """The best k GPUs of ``free`` (only from ``allowed``, when given), or
    None when fewer than k are free and allowed."""
    return _chooser(topology).choose(free, k, free if allowed is None else allowed & free)


def evaluate(topology: GpuTopology, gpus, free: int) -> GpuChoice:
    """The objective of taking ``gpus`` out of ``free``, from its definition."""
    chosen = tuple(sorted(gpus))
    left = [i for i in gpus_of(free) if i not in chosen]
    links = [topology.link(i, j) for i, j in combinations(chosen, 2)]
    numas = {topology.gpus[i].numa for i in chosen} - {None}
    return GpuChoice(
        gpus=chosen,
        worst=min((link.rank for link in links), default=NO_LINK),
        gbps=sum(link.gbps for link in links),
        numa_nodes=max(1, len(numas)),
        leftover_gbps=sum(topology.link(i, j).gbps for i, j in combinations(left, 2)),
    )


def choose_exhaustive(topology: GpuTopology, free: int, k: int, allowed: int | None = None) -> GpuChoice | None:
    """``choose_gpus`` by trying every k-subset: the reference for tests."""
    best: GpuChoice | None = None
    for gpus in combinations(gpus_of(free if allowed is None else allowed & free), k):
        choice = evaluate(topology, gpus, free)
        if best is None or choice.objective > best.objective:  # ties keep the earlier, lower tuple
            best = choice
    return best


# By object identity, which is cheaper to look up than equality; equal
# annotations already share one object (annotation.from_annotation).
_choosers: dict[int, _Chooser] = {}


def _chooser(topology: GpuTopology) -> _Chooser:
    chooser = _choosers.get(id(topology))
    if chooser is None:
        if len(_choosers) >= 256:  # topologies come and go with annotations; keep the recent ones
            del _choosers[next(iter(_choosers))]
        chooser = _choosers[id(topology)] = _Chooser(topology)  # holds the topology: the id stays its own
    return chooser


class _Chooser:
    """Link tables of one topology and its answer cache."""

    def __init__(self, topology: GpuTopology):
        n = len(topology)
        self.topology = topology
        self.rank = [[topology.links[i][j].rank if i != j else 0 for j in range(n)] for i in range(n)]
        self.gbps = [[topology.links[i][j].gbps if i != j else 0 for j in range(n)] for i in range(n)]
        self.numa_bit = [0 if g.numa is None else 1 << g.numa for g in topology.gpus]
        self.cache: dict[tuple[int, int, int], GpuChoice | None] = {}

    def choose(self, free: int, k: int, allowed: int) -> GpuChoice | None:
        key = (free, k, allowed)
        if key in self.cache:
            return self.cache[key]
        if len(self.cache) >= CACHE_SIZE:
            del self.cache[next(iter(self.cache))]  # the oldest answer
        answer = self.cache[key] = self._solve(free, k, allowed)
        return answer

    def _best_worst(self, candidates: list[int], k: int) -> int:
        """The best worst-link rank any k of ``candidates`` reach together."""
        if k == 1:
            return NO_LINK
        among = mask_of(candidates)
        for rank in sorted({self.rank[i][j] for i, j in combinations(candidates, 2)}, reverse=True):
            linked = [mask_of(j for j in candidates if j != i and self.rank[i][j] >= rank) if among >> i & 1 else 0
                      for i in range(len(self.rank))]
            if has_clique(linked, among, k):
                return rank
        raise AssertionError("the weakest link class connects every pair")

    def _classes(self, free_gpus: list[int], candidates: list[int]) -> list[list[int]]:
        """Candidates that are interchangeable given the free set, lowest index first."""
        links, numa = self.topology.links, self.numa_bit
        classes: list[list[int]] = []
        for gpu in candidates:
            for members in classes:
                other = members[0]
                if numa[gpu] == numa[other] and all(
                        links[gpu][w] == links[other][w] for w in free_gpus if w != gpu and w != other):
                    members.append(gpu)
                    break
            else:
                classes.append([gpu])
        return classes

    def _solve(self, free: int, k: int, allowed: int) -> GpuChoice | None:
        free_gpus, candidates = list(gpus_of(free)), list(gpus_of(allowed))
        if k < 1 or len(candidates) < k:
            return None
        rank, gbps = self.rank, self.gbps
        target = self._best_worst(candidates, k)
        classes = self._classes(free_gpus, candidates)
        reps = [members[0] for members in classes]
        sizes = [len(members) for members in classes]
        # a class's members are pairwise linked alike, so one pair stands for all
        inner_rank = [rank[m[0]][m[1]] if len(m) > 1 else NO_LINK for m in classes]
        inner_gbps = [gbps[m[0]][m[1]] if len(m) > 1 else 0 for m in classes]
        degree = [sum(gbps[r][w] for w in free_gpus) for r in reps]  # bandwidth to every other free GPU
        numa_bits = [self.numa_bit[r] for r in reps]
        free_gbps = sum(gbps[i][j] for i, j in combinations(free_gpus, 2))
        room_after = [sum(sizes[c:]) for c in range(len(classes))]
        counts = [0] * len(classes)
        chosen: list[int] = []
        best: list = [None, None]  # (gbps, -numa, leftover), gpus

        def search(start: int, remaining: int, set_gbps: int, numa: int, degrees: int) -> None:
            if remaining == 0:
                # leftover pairs = all free pairs - pairs inside the set - pairs across
                score = (set_gbps, -max(1, numa.bit_count()), free_gbps + set_gbps - degrees)
                if best[0] is None or score >= best[0]:
                    gpus = tuple(sorted(g for c in chosen for g in classes[c][:counts[c]]))
                    if best[0] is None or score > best[0] or gpus < best[1]:
                        best[0], best[1] = score, gpus
                return
            for c in range(start, len(classes)):
                if room_after[c] < remaining:
                    return
                if any(rank[reps[c]][reps[d]] < target for d in chosen):
                    continue
                to_chosen = sum(counts[d] * gbps[reps[c]][reps[d]] for d in chosen)
                chosen.append(c)
                for take in range(min(sizes[c], remaining), 0, -1):
                    if take > 1 and inner_rank[c] < target:
                        continue
                    counts[c] = take
                    search(c + 1, remaining - take, set_gbps + take * to_chosen + comb(take, 2) * inner_gbps[c],
                           numa | numa_bits[c], degrees + take * degree[c])
                counts[c] = 0
                chosen.pop()

        search(0, k, 0, 0, 0)
        (set_gbps, negative_numa, leftover), gpus = best
        return GpuChoice(gpus, target, set_gbps, -negative_numa, leftover)
