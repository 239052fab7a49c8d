"""The shell commands the docs quote, and running them as a reader would.

The rule and the markers are in docs/testing.md, "The docs check": commands
are in ```sh, bash, shell and console blocks (in console, the ``$ `` lines);
HTML comments right above a fence mark what cannot run here (``skip``, with a
reason), what runs in the background, and a promised exit status.
"""
from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

COMMAND_LANGUAGES = {"sh", "bash", "shell", "console"}
FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([\w+-]*)")
MARKER = re.compile(r"^\s*<!--\s*docs-check:\s*(.*?)\s*-->\s*$")
DIRECTIVE = re.compile(r"^(?P<kind>skip|background|exit\s+(?P<code>\d+))"
                       r"(?:\s+`(?P<prefix>[^`]+)`)?(?:\s+\((?P<reason>.*)\))?$")
HEREDOC = re.compile(r"(?<!<)<<-?(?!<)\s*(['\"]?)(\w+)\1")  # not a <<< here-string
CONTINUATIONS = ("\\", "|", "&&", "||")
PROMPT = "$ "


@dataclass
class Command:
    path: str
    line: int  # 1-based line of the command's first line in the document
    text: str
    skip: str | None = None  # why it is not run here
    background: bool = False
    exit_code: int = 0

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"


@dataclass
class Document:
    commands: list[Command] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # "path:line: what is wrong"


def parse_document(text: str, path: str) -> Document:
    doc = Document()
    lines = text.splitlines()
    markers: list[tuple[int, str]] = []  # (line, directive) right above the next fence
    i = 0
    while i < len(lines):
        marker = MARKER.match(lines[i])
        fence = FENCE.match(lines[i])
        if marker:
            markers.append((i + 1, marker.group(1)))
            i += 1
            continue
        if not fence:
            if markers:
                doc.problems.append(f"{path}:{markers[0][0]}: docs-check marker not right above a fenced block")
                markers = []
            i += 1
            continue
        indent, ticks, language = fence.groups()
        end = i + 1
        while end < len(lines) and not re.match(rf"^\s*{re.escape(ticks[0])}{{{len(ticks)},}}\s*$", lines[end]):
            end += 1
        body = [line[len(indent):] if line.startswith(indent) else line.lstrip() for line in lines[i + 1:end]]
        _parse_block(doc, path, i + 2, language.lower(), body, markers)
        markers = []
        i = end + 1
    if markers:
        doc.problems.append(f"{path}:{markers[0][0]}: docs-check marker not right above a fenced block")
    return doc


def _parse_block(doc: Document, path: str, first_line: int, language: str, body: list[str],
                 markers: list[tuple[int, str]]) -> None:
    if language not in COMMAND_LANGUAGES:
        for line, _ in markers:
            doc.problems.append(f"{path}:{line}: docs-check marker above a ```{language} block, which holds "
                                f"no commands (commands are in ```sh, bash, shell or console blocks)")
        if not language:
            for n, line in enumerate(body):
                if line.startswith(PROMPT):
                    doc.problems.append(f"{path}:{first_line + n}: a `$ ` prompt in an unlabelled block: "
                                        f"label it ```console so the docs check runs it")
        return
    commands = _split_commands(path, first_line, body, prompted_only=language == "console")
    for line, directive in markers:
        _apply(doc, f"{path}:{line}", directive, commands)
    doc.commands.extend(commands)


def _split_commands(path: str, first_line: int, body: list[str], prompted_only: bool) -> list[Command]:
    commands = []
    n = 0
    while n < len(body):
        line = body[n]
        if line.startswith(PROMPT):
            line = line[len(PROMPT):]
        elif prompted_only or not line.strip() or line.lstrip().startswith("#"):
            n += 1
            continue
        start, parts = n, [line]
        heredoc = HEREDOC.search(line)
        n += 1
        while n < len(body):
            if heredoc:
                parts.append(body[n])
                n += 1
                if body[n - 1].strip() == heredoc.group(2):
                    heredoc = None
                continue
            if not parts[-1].rstrip().endswith(CONTINUATIONS):
                break
            parts.append(body[n])
            heredoc = HEREDOC.search(body[n])
            n += 1
        commands.append(Command(path, first_line + start, "\n".join(parts)))
    return commands


def _apply(doc: Document, where: str, directive: str, commands: list[Command]) -> None:
    parsed = DIRECTIVE.match(directive)
    if not parsed:
        doc.problems.append(f"{where}: unknown docs-check directive {directive!r} "
                            f"(skip [`PREFIX`] (REASON), background [`PREFIX`], exit N [`PREFIX`])")
        return
    kind, prefix, reason = parsed["kind"], parsed["prefix"], parsed["reason"]
    if kind == "skip" and not (reason or "").strip():
        doc.problems.append(f"{where}: docs-check skip without a reason: say why it cannot run here, "
                            f"e.g. <!-- docs-check: skip (needs a GPU node: nvidia-smi) -->")
        return
    if kind != "skip" and reason is not None:
        doc.problems.append(f"{where}: docs-check {kind} takes no reason")
        return
    chosen = [c for c in commands if prefix is None or c.text.startswith(prefix)]
    if not chosen:
        doc.problems.append(f"{where}: docs-check {kind}: no command of the block below starts with `{prefix}`"
                            if prefix else f"{where}: docs-check {kind} above a block without commands")
        return
    for command in chosen:
        if kind == "skip":
            command.skip = reason.strip()
        elif kind == "background":
            command.background = True
        else:
            command.exit_code = int(parsed["code"])


def documents(root: Path) -> list[Path]:
    """What a user reads and copies commands from: bench/RESULTS.md too, whose
    commands reproduce its figures."""
    return [root / "README.md", *sorted((root / "docs").glob("*.md")), root / "e2e" / "README.md",
            root / "bench" / "RESULTS.md"]


def parse_file(path: Path, root: Path) -> Document:
    return parse_document(path.read_text(), str(path.relative_to(root)))


# --- running --------------------------------------------------------------

@dataclass
class Outcome:
    command: Command
    status: str  # "ok", "failed", "timed out", "not run"
    detail: str = ""  # what went wrong, with the output's tail

    def report(self) -> str:
        return f"{self.command.where}: {self.status}: {self.command.text}\n{self.detail}".rstrip()


def run_commands(commands: list[Command], cwd: Path, env: dict[str, str], workdir: Path,
                 timeout: float = 60.0, output_tail: int = 3000) -> list[Outcome]:
    """Run the commands in order in one bash, as a reader pasting them would
    (so ``export`` and ``cd`` carry over); stop at the first one that fails.
    Background commands must still be running after the last command; then
    every process the script started is stopped. ``timeout`` is per command."""
    runnable = [c for c in commands if c.skip is None]
    status_file = workdir / "status"
    status = shlex.quote(str(status_file))
    script = ["set -o pipefail", "__docs_check_bg=()",
              # on the way out, however it ends: which background commands still run
              "__docs_check_background() {",
              "  [ ${#__docs_check_bg[@]} -eq 0 ] && return",
              "  sleep 1  # a watch or server that fails at once gets a moment to show it",
              "  for entry in \"${__docs_check_bg[@]}\"; do",
              "    n=${entry%%:*}; pid=${entry##*:}",
              f"    if kill -0 $pid 2>/dev/null; then echo \"alive $n\" >>{status};",
              f"    else wait $pid; echo \"exited $n $?\" >>{status}; fi",
              "  done",
              "}",
              "trap __docs_check_background EXIT"]
    for n, command in enumerate(runnable):
        group = f"{{\n{command.text}\n}} >{shlex.quote(str(workdir / f'{n}.log'))} 2>&1 </dev/null"
        if command.background:
            script += [f"{group} &", f"__docs_check_bg+=({n}:$!)"]
        else:
            script += [f"echo 'start {n}' >>{status}", group, "__docs_check_rc=$?",
                       f"echo \"end {n} $__docs_check_rc\" >>{status}",
                       f"[ $__docs_check_rc -eq {command.exit_code} ] || exit 0"]
    (workdir / "script.sh").write_text("\n".join(script) + "\n")
    status_file.write_text("")

    with open(workdir / "script.err", "wb") as errors:
        proc = subprocess.Popen(["bash", "--noprofile", "--norc", str(workdir / "script.sh")], cwd=cwd, env=env,
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=errors,
                                start_new_session=True)
    timed_out = None
    started_at, current = time.monotonic(), None
    try:
        while proc.poll() is None:
            started = [line.split()[1] for line in status_file.read_text().splitlines() if line.startswith("start ")]
            if started and started[-1] != current:
                current, started_at = started[-1], time.monotonic()
            if current is not None and time.monotonic() - started_at > timeout:
                timed_out = int(current)
                break
            time.sleep(0.1)
    finally:
        _stop_group(proc)
    script_errors = (workdir / "script.err").read_text(errors="replace")

    ended, alive, exited = {}, set(), {}
    for line in status_file.read_text().splitlines():
        kind, n, *rest = line.split()
        if kind == "end":
            ended[int(n)] = int(rest[0])
        elif kind == "alive":
            alive.add(int(n))
        elif kind == "exited":
            exited[int(n)] = int(rest[0])

    def tail(n: int) -> str:
        log = workdir / f"{n}.log"
        text = log.read_text(errors="replace") if log.exists() else ""
        return f"--- output (tail) ---\n{text[-output_tail:]}" if text else "(no output)"

    outcomes = []
    for n, command in enumerate(runnable):
        if command.background and n in alive:
            outcomes.append(Outcome(command, "ok"))
        elif command.background and n in exited:
            outcomes.append(Outcome(command, "failed", f"a background command exited ({exited[n]}) before "
                                                       f"the file's other commands were done\n{tail(n)}"))
        elif n in ended and ended[n] == command.exit_code:
            outcomes.append(Outcome(command, "ok"))
        elif n in ended:
            outcomes.append(Outcome(command, "failed",
                                    f"exit status {ended[n]}, expected {command.exit_code}\n{tail(n)}"))
        elif n == timed_out:
            outcomes.append(Outcome(command, "timed out", f"still running after {timeout:.0f} s\n{tail(n)}"))
        else:
            outcomes.append(Outcome(command, "not run", "the run stopped before it"
                                    + (f": {script_errors[-500:]}" if script_errors.strip() else "")))
    return outcomes


def _stop_group(proc: subprocess.Popen) -> None:
    """Stop the script and whatever it left running: the session it leads."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            proc.poll()  # reap the script, or its group never looks empty
            try:
                os.killpg(proc.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.05)
    proc.wait()
