"""The docs check's reading of Markdown (which commands, how marked) and its
runner (order, exit status, background commands, timeout), without a cluster;
tests/integration/test_docs_commands.py runs the real docs against one."""
from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

from tests.support.doc_commands import documents, parse_document, run_commands

ROOT = Path(__file__).resolve().parents[2]


def parse(markdown: str):
    return parse_document(textwrap.dedent(markdown), "doc.md")


def texts(markdown: str) -> list[str]:
    doc = parse(markdown)
    assert doc.problems == []
    return [c.text for c in doc.commands]


def test_commands_come_from_shell_blocks_only_and_comments_are_not_commands():
    assert texts("""
        ```sh
        kubectl get nodes   # a trailing comment stays with its command
            # a comment line alone is not a command

        batchsched --version
        ```
        ```
        kubectl get pods    (unlabelled: output or text)
        ```
        ```yaml
        kind: Pod
        ```
        ```bash
        make demo
        ```
        """) == ["kubectl get nodes   # a trailing comment stays with its command", "batchsched --version",
                 "make demo"]


def test_continuations_heredocs_and_prompts():
    doc = parse("""
        # title
        ```console
        $ kubectl apply -f - <<EOF
        kind: Namespace
        metadata: {name: x}
        EOF
        namespace/x created
        $ batchsched topo parse f.txt \\
            --format json |
          head -1
        {
        ```
        ```sh
        $ echo one &&
          echo two
        tr a b <<< "abc"
        echo three
        ```
        """)
    assert doc.problems == []
    assert [(c.line, c.text) for c in doc.commands] == [
        (4, "kubectl apply -f - <<EOF\nkind: Namespace\nmetadata: {name: x}\nEOF"),
        (9, "batchsched topo parse f.txt \\\n    --format json |\n  head -1"),
        (15, "echo one &&\n  echo two"),
        (17, 'tr a b <<< "abc"'),  # a here-string is no heredoc
        (18, "echo three"),
    ]


def test_markers_skip_background_and_exit_status_by_prefix():
    doc = parse("""
        <!-- docs-check: skip `docker build` (needs Docker) -->
        <!-- docs-check: background `kubectl get bspg` -->
        <!-- docs-check: exit 1 `batchsched explain` -->
        ```sh
        docker build -t x .
        kubectl get bspg -w
        batchsched explain nothing
        kubectl get nodes
        ```
        <!-- docs-check: skip (needs a GPU node: nvidia-smi) -->
        ```sh
        nvidia-smi topo -m
        ```
        """)
    assert doc.problems == []
    assert [(c.text.split()[0], c.skip, c.background, c.exit_code) for c in doc.commands] == [
        ("docker", "needs Docker", False, 0),
        ("kubectl", None, True, 0),
        ("batchsched", None, False, 1),
        ("kubectl", None, False, 0),
        ("nvidia-smi", "needs a GPU node: nvidia-smi", False, 0),
    ]


@pytest.mark.parametrize("markdown, problem", [
    ("<!-- docs-check: skip -->\n```sh\nls\n```\n", "doc.md:1: docs-check skip without a reason"),
    ("<!-- docs-check: skip () -->\n```sh\nls\n```\n", "doc.md:1: docs-check skip without a reason"),
    ("<!-- docs-check: skip `make` (slow) -->\n```sh\nls\n```\n", "no command of the block below starts with `make`"),
    ("<!-- docs-check: ignore (x) -->\n```sh\nls\n```\n", "unknown docs-check directive"),
    ("<!-- docs-check: skip (x) -->\n```yaml\na: 1\n```\n", "holds no commands"),
    ("<!-- docs-check: skip (x) -->\n\ntext\n```sh\nls\n```\n", "not right above a fenced block"),
    ("```\n$ kubectl get pods\n```\n", "doc.md:2: a `$ ` prompt in an unlabelled block"),
])
def test_a_malformed_or_misplaced_marker_is_a_problem(markdown, problem):
    problems = parse_document(markdown, "doc.md").problems
    assert len(problems) == 1 and problem in problems[0], problems


@pytest.mark.parametrize("path", documents(ROOT), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_marker_in_the_docs_is_well_formed(path):
    assert parse_document(path.read_text(), str(path.relative_to(ROOT))).problems == []


def commands(markdown: str):
    doc = parse(markdown)
    assert doc.problems == []
    return doc.commands


def test_commands_run_in_order_in_one_shell_and_stop_at_the_first_failure(tmp_path):
    outcomes = run_commands(commands("""
        ```sh
        export GREETING=hello
        cd /
        test "$GREETING" = hello && test "$PWD" = /
        false | true     # a pipeline fails when any part fails
        echo never
        ```
        """), tmp_path, dict(os.environ), tmp_path)
    assert [o.status for o in outcomes] == ["ok", "ok", "ok", "failed", "not run"]
    assert "doc.md:6: failed: false | true" in outcomes[3].report()
    assert "exit status 1, expected 0" in outcomes[3].report()


def test_the_report_names_the_documented_exit_status_and_shows_the_output_tail(tmp_path):
    outcomes = run_commands(commands("""
        <!-- docs-check: exit 2 `sh -c` -->
        ```sh
        sh -c 'echo told you >&2; exit 2'
        sh -c 'echo something broke; exit 3'
        ```
        """), tmp_path, dict(os.environ), tmp_path)
    assert [o.status for o in outcomes] == ["ok", "failed"]
    assert "exit status 3, expected 2" in outcomes[1].detail and "something broke" in outcomes[1].detail


def running(pid: int) -> bool:
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"


def test_a_background_command_must_outlive_the_file_and_is_then_stopped(tmp_path):
    pid_file = tmp_path / "pid"
    outcomes = run_commands(commands(f"""
        <!-- docs-check: background `sleep` -->
        <!-- docs-check: background `sh -c` -->
        ```sh
        sleep 300 & echo $! >{pid_file}; wait
        sh -c 'echo no such resource >&2; exit 1'
        true
        ```
        """), tmp_path, dict(os.environ), tmp_path)
    assert [o.status for o in outcomes] == ["ok", "failed", "ok"]
    assert "a background command exited (1)" in outcomes[1].detail and "no such resource" in outcomes[1].detail
    assert not running(int(pid_file.read_text()))


def test_a_command_that_hangs_times_out_and_is_stopped(tmp_path):
    outcomes = run_commands(commands("""
        ```sh
        echo waiting; sleep 300
        true
        ```
        """), tmp_path, dict(os.environ), tmp_path, timeout=1)
    assert [o.status for o in outcomes] == ["timed out", "not run"]
    assert "still running after 1 s" in outcomes[0].detail and "waiting" in outcomes[0].detail
