"""Help texts that render as sentences.

Docstrings are wrapped at 100 columns in the source. Typer joins the lines of a command's
own help page, but in rich mode it keeps the source's line breaks in a group's command list,
so rich then wraps each line again and the list breaks mid-sentence. Rather than write every
help text as one long line, each command keeps its readable docstring and ``unwrap_help``
hands typer the same text with each paragraph joined into one line."""

from __future__ import annotations

import inspect

import typer


def paragraphs(text: str) -> str:
    """``text`` dedented, each paragraph (separated by blank lines) joined into one line."""
    blocks = inspect.cleandoc(text).split("\n\n")
    return "\n\n".join(" ".join(b.split()) for b in blocks if b.strip())


def unwrap_help(app: typer.Typer) -> None:
    """Give every command of ``app`` and of its sub-apps its docstring as unwrapped help,
    unless it already has an explicit ``help=``. Call once, after all commands are added."""
    for info in app.registered_commands:
        doc = info.help or (info.callback.__doc__ if info.callback else None)
        if doc:
            info.help = paragraphs(doc)
    for group in app.registered_groups:
        if group.typer_instance is not None:
            unwrap_help(group.typer_instance)
