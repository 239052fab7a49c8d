"""`batchsched simulate`: the README's first command, and its options."""
import io
import subprocess
import sys

import pytest

from batchsched.cli import main
from batchsched.sim.progress import TerminalProgress
from batchsched.sim.scenario import build_scenario, run_scenario

SMALL_CLUSTER = "nodes:\n  - {name: n, count: 2, gpus: 8, topology: dgx-h100}\n"
SMALL_WORKLOAD = ("name,arrival,duration,pods,gpus\n"
                  "a,0,600,2,8\nb,30,300,1,4\nc,60,300,1,2\nd,90,100,2,8\n")


def test_simulate_without_arguments_runs_the_embedded_default(tmp_path):
    # from another directory, as an installed command: the defaults are package data
    done = subprocess.run([sys.executable, "-m", "batchsched", "simulate"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "cluster:  embedded default (40 nodes, 320 GPUs" in out
    assert "workload: embedded default (" in out
    header = next(line for line in out.splitlines() if "batchsched" in line and "spread" in line)
    assert header.split() == ["batchsched", "spread", "binpack", "random", "volcano-like", "kai-like"]
    for row in ("jobs placed", "wait p50 / p90 / p99", "GPU allocation", "stranded GPUs",
                "aligned multi-GPU pods", "preempted pods", "unscheduled pods"):
        assert row in out
    assert "No policy could hold more than 80.1% of the GPUs" in out  # seed 1 (bench/RESULTS.md)
    preempted = next(line for line in out.splitlines() if line.startswith("preempted pods"))
    assert preempted.split()[3] != "0"  # preemption is on for batchsched in the default scenario


def test_files_policies_and_plots(tmp_path, capsys):
    (tmp_path / "c.yaml").write_text(SMALL_CLUSTER)
    (tmp_path / "w.csv").write_text(SMALL_WORKLOAD)
    code = main(["simulate", "--cluster", str(tmp_path / "c.yaml"), "--workload", str(tmp_path / "w.csv"),
                 "--policies", "batchsched,binpack", "--plot", str(tmp_path / "charts")])
    out = capsys.readouterr().out
    assert code == 0
    assert "2 nodes, 16 GPUs: 2 dgx-h100" in out and "4 jobs" in out
    # job a alone could hold all 16 GPUs from the first arrival (t=0) to the last (t=90)
    assert "No policy could hold more than 100.0% of the GPUs over the arrival window" in out
    assert sorted(p.name for p in (tmp_path / "charts").iterdir()) == [
        "occupancy-batchsched.png", "occupancy-binpack.png", "utilization.png", "waits.png"]


def test_plot_without_matplotlib_says_how_to_get_it(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import fails
    assert main(["simulate", "--plot", str(tmp_path)]) == 2
    assert "--plot needs matplotlib: pip install 'batchsched[plot]'" in capsys.readouterr().err


def test_bad_input_is_one_line_and_status_1(tmp_path, capsys):
    (tmp_path / "w.csv").write_text("name,arrival,duration\na,0,-5\n")
    assert main(["simulate", "--workload", str(tmp_path / "w.csv")]) == 1
    assert capsys.readouterr().err.strip().endswith("w.csv: line 2: duration: must be at least 0, got '-5'")
    assert main(["simulate", "--policies", "fifo"]) == 1
    assert "unknown policy 'fifo'" in capsys.readouterr().err


PHILLY_MIX = "name,time,application,num_replicas,batch_size\ncifar10-0,53,cifar10,6,2048\nbert-1,90,bert,16,64\n"


def write_philly_mix(trace_dir):
    folder = trace_dir / "pollux-workload-via-blox"
    folder.mkdir(parents=True)
    (folder / "workload-6.csv").write_text(PHILLY_MIX)


@pytest.mark.parametrize("where", ["environment", "working directory"])
def test_traces_are_found_through_the_environment_else_in_traces_here(tmp_path, monkeypatch, capsys, where):
    monkeypatch.chdir(tmp_path)
    if where == "environment":
        monkeypatch.setenv("BATCHSCHED_TRACE_DIR", str(tmp_path / "elsewhere"))
        write_philly_mix(tmp_path / "elsewhere")
    else:
        monkeypatch.delenv("BATCHSCHED_TRACE_DIR", raising=False)
        write_philly_mix(tmp_path / "traces")
    (tmp_path / "c.yaml").write_text(SMALL_CLUSTER)
    assert main(["simulate", "--trace", "philly", "--cluster", str(tmp_path / "c.yaml"),
                 "--policies", "batchsched"]) == 0
    assert "workload: Philly-derived" in capsys.readouterr().out


def test_missing_traces_name_the_file_and_where_it_is_looked_for(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("BATCHSCHED_TRACE_DIR", raising=False)
    assert main(["simulate", "--trace", "philly"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("batchsched: traces/pollux-workload-via-blox/workload-6.csv: no such file; ")
    assert "$BATCHSCHED_TRACE_DIR" in err and err.count("\n") == 1


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_run_shows_its_progress_on_a_terminal_and_erases_it(tmp_path):
    (tmp_path / "c.yaml").write_text(SMALL_CLUSTER)
    (tmp_path / "w.csv").write_text(SMALL_WORKLOAD)
    scenario = build_scenario(tmp_path / "c.yaml", tmp_path / "w.csv", None, None, None, 1, None)
    ticks = iter(range(10_000))
    stream = Terminal()
    run_scenario(scenario, ["batchsched", "binpack"], progress=TerminalProgress(stream, interval=1,
                                                                              clock=lambda: next(ticks)))
    shown = stream.getvalue()
    assert "batchsched: " in shown and "binpack: " in shown and " simulated, " in shown
    total = sum(job.pods for job in scenario.jobs)
    assert f"{total}/{total} pods placed" in shown  # every pod of the small workload is placed
    assert shown.endswith("\r\033[K")  # erased at the end: the summary starts on a clean line
    assert TerminalProgress.if_terminal(io.StringIO()) is None  # piped: nothing is drawn
