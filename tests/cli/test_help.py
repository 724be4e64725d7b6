"""Every command's ``--help`` reads as whole sentences.

Help texts come from docstrings hard-wrapped at 100 columns; if those line breaks reach rich,
it wraps each source line again and the help breaks mid-sentence. These tests render the help
as a person sees it and check that a line only ends where the next word would not fit."""

from __future__ import annotations

import itertools

import pytest
import typer.main
from typer.testing import CliRunner

from raftmq.cli.helptext import paragraphs
from raftmq.cli.main import app

CLI = typer.main.get_command(app)
SLACK = 3  # rich's padding and borders; a line this close to full counts as full


def _commands(group, path: tuple[str, ...] = ()):
    for name, cmd in group.commands.items():
        yield (*path, name), cmd
        if hasattr(cmd, "commands"):  # a group: its commands too
            yield from _commands(cmd, (*path, name))


COMMANDS = dict(_commands(CLI))
GROUPS = [()] + [p for p, c in COMMANDS.items() if hasattr(c, "commands")]


def _help(args: tuple[str, ...], columns: int) -> str:
    result = CliRunner().invoke(app, [*args, "--help"], env={"COLUMNS": str(columns)})
    assert result.exit_code == 0, result.output
    return result.output


def _first_paragraph(cmd) -> str:
    return paragraphs(cmd.help or "").split("\n\n")[0]


def _assert_filled(lines: list[str], width: int, what: str) -> None:
    """Each line but the last is full: the next line's first word would not have fit."""
    for line, nxt in itertools.pairwise(lines):
        next_word = nxt.split()[0]
        assert len(line.rstrip()) + 1 + len(next_word) > width - SLACK, (
            f"{what}: the line {line.strip()!r} ends before {next_word!r}, which fits: "
            "a hard wrap from the source reached the help text"
        )


@pytest.mark.parametrize("path", sorted(COMMANDS), ids=" ".join)
def test_command_help_is_whole_sentences(path: tuple[str, ...]):
    cmd = COMMANDS[path]
    first = _first_paragraph(cmd)
    assert first, f"raftmq {' '.join(path)} has no help text"
    wide = _help(path, 200).splitlines()
    start = next(i for i, line in enumerate(wide) if line.strip().startswith("Usage:")) + 2
    end = next(i for i in range(start, len(wide)) if not wide[i].strip())
    block = wide[start:end]
    assert " ".join(" ".join(block).split()) == first
    _assert_filled(block, 200, f"raftmq {' '.join(path)} --help")
    narrow = " ".join(_help(path, 80).split())
    assert first in narrow  # nothing cut off at 80 columns either


@pytest.mark.parametrize("path", GROUPS, ids=lambda p: " ".join(("raftmq", *p)))
@pytest.mark.parametrize("columns", [200, 80])
def test_command_lists_are_whole_sentences(path: tuple[str, ...], columns: int):
    lines = _help(path, columns).splitlines()
    top = next(i for i, line in enumerate(lines) if "─ Commands ─" in line)
    rows = [line[2:-2] for line in lines[top + 1 :] if line.startswith("│")]
    start = len(rows[0]) - len(rows[0].split(" ", 1)[1].lstrip())  # description column
    width = len(rows[0]) - start
    entries: list[list[str]] = []
    for row in rows:
        if row[:start].strip():
            entries.append([])
        entries[-1].append(row[start:])
    for entry in entries:
        assert " ".join(entry).split()  # every command says what it does
        _assert_filled(entry, width, f"raftmq {' '.join(path)} --help, {entry[0][:30]!r}")


@pytest.mark.parametrize("path", sorted(COMMANDS), ids=" ".join)
def test_every_option_and_argument_has_help(path: tuple[str, ...]):
    for param in COMMANDS[path].params:
        assert getattr(param, "help", None), f"raftmq {' '.join(path)}: {param.name} has no help"
