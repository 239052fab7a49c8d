"""`batchsched explain` argument handling that needs no cluster."""
import argparse

import pytest

from batchsched.cli import build_parser, main


def parsers(parser: argparse.ArgumentParser):
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from parsers(sub)


def test_every_flag_and_argument_has_help():
    missing = [f"{p.prog} {a.dest}" for p in parsers(build_parser()) for a in p._actions
               if not isinstance(a, argparse._SubParsersAction) and not a.help]
    assert missing == []


def test_the_version_is_printed(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0 and capsys.readouterr().out.startswith("batchsched ")


def test_all_namespaces_with_a_target_is_refused(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["explain", "-A", "train"])
    assert exited.value.code == 2
    assert "-A lists the waiting gangs of every namespace; it takes no TARGET" in capsys.readouterr().err
