"""Command line compatible with ``toxiproxy-server``.

Go's flag package takes both ``-port`` and ``--port``, and scripts written for
the Go binary use the single-dash form, so both are accepted here.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys

from chaos.toxiproxy.server import serve
from chaos.toxiproxy.version import SERVER_VERSION

LOG_LEVELS = {
    "trace": logging.DEBUG,
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warn": logging.WARNING,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "fatal": logging.CRITICAL,
    "panic": logging.CRITICAL,
}


def build_parser() -> argparse.ArgumentParser:
    """Flags of the Go server that this implementation supports."""
    parser = argparse.ArgumentParser(
        prog="raftmq-toxiproxy",
        description="toxiproxy 2.x compatible chaos proxy (asyncio)",
    )
    parser.add_argument("-host", "--host", default="localhost", help="host for the API")
    parser.add_argument("-port", "--port", type=int, default=8474, help="port for the API")
    parser.add_argument("-config", "--config", default=None, help="JSON file of proxies")
    parser.add_argument("-seed", "--seed", type=int, default=None, help="random seed")
    parser.add_argument("-version", "--version", action="store_true", help="print version")
    return parser


def _normalise(argv: list[str]) -> list[str]:
    """Accept Go's ``-flag=value`` single-dash form for every flag."""
    out = []
    for arg in argv:
        if arg.startswith("-") and not arg.startswith("--") and "=" in arg:
            flag, value = arg.split("=", 1)
            out += [flag, value]
        else:
            out.append(arg)
    return out


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``raftmq-toxiproxy`` and ``python -m chaos.toxiproxy``."""
    args = build_parser().parse_args(_normalise(sys.argv[1:] if argv is None else argv))
    if args.version:
        print(f"toxiproxy-server version {SERVER_VERSION}")
        return 0
    level = LOG_LEVELS.get(os.environ.get("LOG_LEVEL", "info").lower(), logging.INFO)
    logging.basicConfig(
        level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    try:
        asyncio.run(serve(args.host, args.port, args.config, args.seed))
    except OSError as exc:
        logging.getLogger("chaos.toxiproxy").error("cannot start: %s", exc)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
