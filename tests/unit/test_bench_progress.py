"""The long benchmarks show their progress on stderr when it is a
terminal, through the simulator's own display."""
import io
import sys

from batchsched.sim.progress import TerminalProgress
from tests.unit.test_core_boundary import ROOT
from tests.unit.test_sim_cli import Terminal

sys.path.insert(0, str(ROOT / "bench"))
import decision_digest  # noqa: E402
import queues_cycle  # noqa: E402
import throughput_core  # noqa: E402
import topology_choice  # noqa: E402


def stderr_as(stream, monkeypatch):
    """In the test's body: pytest's capture sets sys.stderr again between a
    fixture and the test."""
    monkeypatch.setattr(sys, "stderr", stream)
    return stream


def test_the_throughput_benchmark_names_its_case_and_counts_pods_placed(monkeypatch):
    terminal = stderr_as(Terminal(), monkeypatch)
    jobs = throughput_core.workload(40, 4, seed=1, arrival_seconds=20)
    row = throughput_core.summary(4, throughput_core.Simulation(
        throughput_core.build_nodes(throughput_core.cluster(4)), jobs, throughput_core.BatchschedPolicy()))
    shown = terminal.getvalue()
    total = sum(job.pods for job in jobs)
    assert shown.startswith("\r\033[K4 nodes: ") and " simulated, " in shown and f"/{total} pods placed" in shown
    assert shown.endswith("\r\033[K")  # erased: the table row starts on a clean line
    assert row["placed"] > 0


def test_the_queues_benchmark_names_its_queues(monkeypatch):
    terminal = stderr_as(Terminal(), monkeypatch)
    jobs = throughput_core.workload(20, 4, seed=1, arrival_seconds=10)
    queues_cycle.run(4, jobs, with_queues=2)
    assert terminal.getvalue().startswith("\r\033[K2 queues, 4 nodes: ")


def test_the_decision_digest_names_its_scenario(monkeypatch, capsys):
    terminal = stderr_as(Terminal(), monkeypatch)
    scenario = ("tiny", throughput_core.build_nodes(throughput_core.cluster(2)),
                throughput_core.workload(10, 2, seed=1, arrival_seconds=5), decision_digest.SchedulerConfig())
    monkeypatch.setattr(decision_digest, "scenarios", lambda quick: [scenario])
    monkeypatch.setattr(sys, "argv", ["decision_digest.py"])
    assert decision_digest.main() == 0
    assert terminal.getvalue().startswith("\r\033[Ktiny: ")
    assert capsys.readouterr().out.count("tiny") == 1  # the digest line on stdout, apart from the display


def test_piped_nothing_is_drawn(monkeypatch):
    piped = stderr_as(io.StringIO(), monkeypatch)
    jobs = throughput_core.workload(10, 2, seed=1, arrival_seconds=5)
    throughput_core.summary(2, throughput_core.Simulation(
        throughput_core.build_nodes(throughput_core.cluster(2)), jobs, throughput_core.BatchschedPolicy()))
    assert piped.getvalue() == ""


def test_the_topology_benchmark_shows_each_replay():
    cluster = object.__new__(topology_choice.Cluster)  # two 2-GPU nodes without topology, not the trace's
    cluster.nodes = [("n0", 2, 8000, 8192, None), ("n1", 2, 8000, 8192, None)]
    cluster.total_gpus, cluster.ideal = 4, {}
    terminal = Terminal()
    progress = TerminalProgress(terminal, interval=0)
    pods = [(2, 100, 100)] * 3  # the third fits nowhere
    replay = topology_choice.replay_in_node(cluster, pods, "lowest", 1, False,
                                            topology_choice.shown(progress, "default, best fit, lowest", len(pods)))
    assert replay.placed == 2 and replay.failed == 1
    assert terminal.getvalue().split("\r\033[K")[1:] == [f"default, best fit, lowest: pod {k}, {k}/3 pods placed"
                                                         for k in range(3)]
    assert topology_choice.shown(None, "x", 3)(0, replay) is None  # piped: nothing to draw
