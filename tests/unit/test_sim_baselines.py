"""The preempting baselines, volcano-like and kai-like, on clusters small
enough to work their decisions out by hand."""
from batchsched.config import SchedulerConfig
from batchsched.sim.baselines import baseline
from batchsched.sim.engine import Simulation, simulate
from batchsched.sim.workload import Job
from tests.unit.test_sim_engine import nodes, training

WHOLE_GANG_VICTIMS = SchedulerConfig.model_validate({"preemption": {
    "enabled": True, "victims": {"matchLabels": {"workload": "inference"}, "gangs": "whole"},
    "preemptors": {"priorityClassNames": ["training"]}}}).preemption.policy()


def inference(name: str, arrival: float, duration: float, pods: int = 1, gpus: int = 8, priority: int = 100) -> Job:
    return Job(name, arrival, duration, pods=pods, min_member=pods, gpus=gpus, cpu="4", memory="16Gi",
               priority=priority, labels={"workload": "inference"})


def test_volcano_like_packs_onto_the_fullest_node_where_binpack_takes_the_first():
    # a: 4 GPUs on n-0; b: 6 GPUs, only n-1 has room; c: 2 GPUs, first fit puts it on n-0 (4 free),
    # packing on n-1 (2 free), which leaves n-0's 4 GPUs whole for d
    jobs = [training("a", 0, 1000, gpus=4), training("b", 1, 1000, gpus=6), training("c", 2, 1000, gpus=2),
            training("d", 3, 1000, gpus=4)]
    waits = {name: simulate(nodes(), jobs, baseline(name)).waits for name in ("binpack", "volcano-like")}
    assert sorted(waits["volcano-like"]) == [0.0, 0.0, 0.0, 0.0]
    assert max(waits["binpack"]) > 0


def test_volcano_like_evicts_a_victim_gang_member_by_member_and_kai_like_whole():
    jobs = [inference("serve", 0, 1000, pods=2), training("train", 200, 100)]
    evicted = {}
    for name in ("volcano-like", "kai-like"):
        simulation = Simulation(nodes(2), jobs, baseline(name, preemption=WHOLE_GANG_VICTIMS))
        result = simulation.run()
        evicted[name] = result.evicted_pods
        assert simulation.runs["default/train"].started == 230.0  # the victims terminate for 30 s
        assert result.jobs_finished == 2
    # volcano-like takes one member and leaves the gang below its quorum; kai-like the whole job
    assert evicted == {"volcano-like": 1, "kai-like": 2}


def test_on_a_node_the_victims_are_the_lowest_priority_then_the_youngest():
    jobs = [inference("low", 0, 1000, gpus=2, priority=50), inference("old", 0, 1000, gpus=3),
            inference("young", 10, 1000, gpus=3), training("train", 300, 100, gpus=5)]
    for name in ("volcano-like", "kai-like"):
        simulation = Simulation(nodes(1), jobs, baseline(name, preemption=WHOLE_GANG_VICTIMS))
        result = simulation.run()
        assert result.evicted_pods == 2, name
        runs = simulation.runs
        assert runs["default/train"].started == 330.0
        assert runs["default/low"].remaining == 700 and runs["default/young"].remaining == 710
        assert runs["default/old"].remaining == 1000


def test_kai_like_chooses_victim_jobs_across_nodes_volcano_like_node_by_node():
    # each node full with one inference pod; low (priority 50) runs on the last node
    jobs = [inference("old", 0, 1000), inference("young", 10, 1000), inference("low", 20, 1000, priority=50),
            training("train", 300, 100)]
    evicted = {}
    for name in ("volcano-like", "kai-like"):
        simulation = Simulation(nodes(3), jobs, baseline(name, preemption=WHOLE_GANG_VICTIMS))
        simulation.run()
        evicted[name] = sorted(key for key, run in simulation.runs.items() if run.remaining < 1000
                               and key != "default/train")
    # Volcano's preempt takes the first node in score order (all equally full: by name) where victims
    # suffice; KAI's solver adds the cheapest job first, wherever it runs
    assert evicted == {"volcano-like": ["default/old"], "kai-like": ["default/low"]}


def test_nothing_is_evicted_when_the_quorum_would_not_fit_even_then():
    jobs = [inference("serve", 0, 500, pods=2), training("too-big", 100, 100, pods=3)]
    for name in ("volcano-like", "kai-like"):
        result = simulate(nodes(2), jobs, baseline(name, preemption=WHOLE_GANG_VICTIMS))
        assert result.evicted_pods == 0 and result.jobs_finished == 1, name


def test_without_preemption_they_only_pack():
    jobs = [inference("serve", 0, 500), training("train", 100, 100)]
    for name in ("volcano-like", "kai-like"):
        simulation = Simulation(nodes(1), jobs, baseline(name))  # preemption off by default
        result = simulation.run()
        assert result.evicted_pods == 0 and simulation.runs["default/train"].started == 500.0, name


def test_a_baseline_is_one_line_in_the_registry(monkeypatch):
    """Every baseline is made from the table by its name, and a line added
    to the table (here: binpack's rules under another name) is one the
    simulator runs, deciding as the rules it names."""
    from batchsched.sim import baselines
    from batchsched.sim.baselines.count_only import binpack

    assert baselines.NAMES == tuple(baselines.BASELINES)
    assert all(baseline(name).name == name for name in baselines.NAMES)
    monkeypatch.setitem(baselines.BASELINES, "first-fit-gangs", lambda name, seed, queue, preemption:
                        binpack(name, seed))
    jobs = [training("a", 0, 1000, gpus=4), training("b", 1, 1000, gpus=6), training("c", 2, 1000, gpus=2),
            training("d", 3, 1000, gpus=4)]
    added = simulate(nodes(), jobs, baseline("first-fit-gangs"))
    assert added.waits == simulate(nodes(), jobs, baseline("binpack")).waits and max(added.waits) > 0
