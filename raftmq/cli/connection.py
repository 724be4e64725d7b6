"""How the commands that connect to a cluster reach it: ``--config FILE``, ``--tls-ca``,
``--tls-cert``, ``--tls-key`` and the ``--sasl-*`` credentials, given to every such
command in one place.

Why one place: every command that connects takes ``--bootstrap`` (and ``--data``), and
each would otherwise repeat four options and their help. :func:`add_connection_options`
gives them to every command that has a ``bootstrap`` parameter, once all are registered
(as raftmq.cli.helptext does for help texts), and the commands build their clients with
:func:`client_tls` and find addresses with raftmq.cli.cluster_cmd.cluster_addresses,
which read what the options said.

The client configuration file is TOML, with Kafka's names (docs/security.md)::

    bootstrap = "127.0.0.1:9091,127.0.0.1:9092"
    ssl_cafile = "ca.pem"
    ssl_certfile = "client.pem"
    ssl_keyfile = "client-key.pem"
    sasl_mechanism = "SCRAM-SHA-256"     # or "OAUTHBEARER" with sasl_oauth_token
    sasl_username = "admin"
    sasl_password = "..."

Relative paths are taken from the file's folder, so the file can travel with its
certificates. A ``--tls-*`` or ``--sasl-*`` flag overrides the file's setting,
``--bootstrap`` its addresses.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import typer

from raftmq.client.connections import SecuritySettings
from raftmq.client.sasl import client_security

TLS_KEYS = ("ssl_cafile", "ssl_certfile", "ssl_keyfile")
SASL_KEYS = ("sasl_mechanism", "sasl_username", "sasl_password", "sasl_oauth_token")
CONFIG_KEYS = frozenset({"bootstrap", *TLS_KEYS, *SASL_KEYS})


@dataclass(frozen=True)
class ClientConfig:
    """Where a command connects, with which TLS files and credentials."""

    bootstrap: list[str] = field(default_factory=list)
    tls: SecuritySettings = field(default_factory=lambda: SecuritySettings())


_current: contextvars.ContextVar[ClientConfig | None] = contextvars.ContextVar(
    "raftmq_client_config", default=None
)


def current() -> ClientConfig:
    """What this command's ``--config`` and ``--tls-*`` options said."""
    return _current.get() or ClientConfig()


def client_tls() -> SecuritySettings:
    """The TLS and authentication keyword settings for this command's clients."""
    return current().tls


def load(path: Path) -> ClientConfig:
    """A client configuration file (TOML; see the module's doc). Raises ValueError saying
    what is wrong with it."""
    try:
        data = tomllib.loads(path.read_text())
    except OSError as exc:
        raise ValueError(f"cannot read the client configuration {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{path} is not TOML: {exc}") from None
    unknown = sorted(set(data) - CONFIG_KEYS)
    if unknown:
        raise ValueError(
            f"{path}: unknown setting(s) {', '.join(unknown)}; "
            f"known: {', '.join(sorted(CONFIG_KEYS))}"
        )
    bootstrap = data.get("bootstrap", [])
    if isinstance(bootstrap, str):
        bootstrap = [a.strip() for a in bootstrap.split(",") if a.strip()]
    tls = SecuritySettings()
    for key in TLS_KEYS:
        if key in data:
            tls[key] = str(path.parent / str(data[key]))  # type: ignore[literal-required]
    for key in SASL_KEYS:
        if key in data:
            tls[key] = str(data[key])  # type: ignore[literal-required]
    return ClientConfig(list(bootstrap), tls)


def _resolve(config: Path | None, flags: dict[str, Any]) -> ClientConfig:
    """The configuration file's settings with the flags given (``flags``: Kafka's name
    -> the flag's value, None when not given) on top."""
    base = load(config) if config is not None else ClientConfig()
    tls = SecuritySettings(**base.tls)
    for key, flag in flags.items():
        if flag is not None:
            tls[key] = str(flag)  # type: ignore[literal-required]
    return ClientConfig(base.bootstrap, tls)


def _path_option(name: str, option: Any, kind: Any = Path) -> inspect.Parameter:
    """A keyword parameter ``name`` taking a path (or ``kind``), None by default, as typer
    reads it."""
    return inspect.Parameter(
        name,
        inspect.Parameter.KEYWORD_ONLY,
        default=None,
        annotation=Annotated[kind | None, option],
    )


def _config_option(flag: str) -> inspect.Parameter:
    return _path_option(
        "client_config",
        typer.Option(
            flag,
            help="A client configuration file (TOML: bootstrap, ssl_cafile, ssl_certfile, "
            "ssl_keyfile, sasl_mechanism, sasl_username, sasl_password, sasl_oauth_token), "
            "e.g. the one 'raftmq dev --secure' writes.",
        ),
    )


_TLS_OPTIONS = (
    _path_option(
        "tls_ca", typer.Option(help="TLS: the CA file that signed the brokers' certificates.")
    ),
    _path_option("tls_cert", typer.Option(help="TLS: this client's certificate, for mutual TLS.")),
    _path_option("tls_key", typer.Option(help="TLS: the key of --tls-cert.")),
)
_SASL_OPTIONS = (
    _path_option(
        "sasl_mechanism",
        typer.Option(help="Authentication: SCRAM-SHA-256 or OAUTHBEARER (docs/security.md)."),
        str,
    ),
    _path_option("sasl_username", typer.Option(help="SCRAM-SHA-256: the user."), str),
    _path_option(
        "sasl_password",
        typer.Option(help="SCRAM-SHA-256: the password (better in --config's file)."),
        str,
    ),
    _path_option("sasl_oauth_token", typer.Option(help="OAUTHBEARER: the bearer token."), str),
)
LOCAL_CONFIG = "client.toml"
"""The client configuration ``raftmq dev --secure`` writes into its data folder: a command
that finds the local cluster through ``--data`` (no ``--bootstrap``) and is given no
connection settings uses it, as it uses that folder's cluster file."""
_FLAG_KEYS = {"tls_ca": "ssl_cafile", "tls_cert": "ssl_certfile", "tls_key": "ssl_keyfile"}
"""Each --tls-* flag's parameter -> the setting it overrides (a --sasl-* one: its own)."""


def with_connection_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """``command`` with the options of this module added; they are read before it runs."""
    signature = inspect.signature(command, eval_str=True)

    @functools.wraps(command)
    def run(*args: Any, client_config: Path | None = None, **kwargs: Any) -> Any:
        flags = {
            _FLAG_KEYS.get(p.name, p.name): kwargs.pop(p.name, None)
            for p in (*_TLS_OPTIONS, *_SASL_OPTIONS)
        }
        if client_config is None and not kwargs.get("bootstrap") and not any(flags.values()):
            local = Path(kwargs.get("data") or ".") / LOCAL_CONFIG
            client_config = local if "data" in kwargs and local.exists() else None
        try:
            resolved = _resolve(client_config, flags)
            client_security(**resolved.tls)  # settings that do not go together: said now
        except ValueError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from None
        token = _current.set(resolved)
        try:
            return command(*args, **kwargs)
        finally:
            _current.reset(token)

    # A command with a --config of its own (topic create: topic settings) gets the file as
    # --client-config.
    flag = "--client-config" if "config" in signature.parameters else "--config"
    added = (_config_option(flag), *_TLS_OPTIONS, *_SASL_OPTIONS)
    extended = signature.replace(parameters=[*signature.parameters.values(), *added])
    run.__signature__ = extended  # type: ignore[attr-defined]
    del run.__wrapped__  # typer must read the new signature, not the command's
    # Evaluated already (the command's module may use postponed annotations, whose names
    # would not resolve here).
    run.__annotations__ = {p.name: p.annotation for p in extended.parameters.values()}
    return run


def add_connection_options(app: typer.Typer) -> None:
    """Give every command of ``app`` and its sub-apps that takes ``bootstrap`` (it
    connects to a cluster) the options of this module. Call once, after every command
    is added."""
    for info in app.registered_commands:
        callback = info.callback
        if callback is not None and "bootstrap" in inspect.signature(callback).parameters:
            info.callback = with_connection_options(callback)
    for group in app.registered_groups:
        if group.typer_instance is not None:
            add_connection_options(group.typer_instance)
