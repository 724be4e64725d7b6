"""The ``raftmq`` command: one entry point, a group per layer (log now; broker, dev, topic,
chaos as they land)."""

from __future__ import annotations

import typer

from raftmq.cli import (
    acl_cmd,
    broker_cmd,
    chaos_cmd,
    cluster_admin_cmd,
    cluster_cmd,
    dlq_cmd,
    group_cmd,
    log_cmd,
    quota_cmd,
    records_cmd,
    share_group_cmd,
    status_cmd,
    topic_cmd,
    txn_cmd,
    user_cmd,
)
from raftmq.cli.connection import add_connection_options
from raftmq.cli.helptext import unwrap_help

app = typer.Typer(
    name="raftmq",
    help="raftmq: a durable, replicated log service (Kafka's model, Raft per partition).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.add_typer(log_cmd.app, name="log")
app.add_typer(chaos_cmd.app, name="chaos")
app.add_typer(topic_cmd.app, name="topic")
app.add_typer(group_cmd.app, name="group")
app.add_typer(share_group_cmd.app, name="share-group")
app.add_typer(txn_cmd.app, name="txn")
app.add_typer(dlq_cmd.app, name="dlq")
app.add_typer(cluster_admin_cmd.app, name="cluster")
app.add_typer(broker_cmd.app, name="broker")
app.add_typer(user_cmd.app, name="user")
app.add_typer(acl_cmd.app, name="acl")
app.add_typer(quota_cmd.app, name="quota")
app.command()(cluster_cmd.dev)
app.command()(cluster_cmd.demo)
app.command()(status_cmd.status)
app.command()(records_cmd.produce)
app.command()(records_cmd.consume)
unwrap_help(app)  # after every command is added
add_connection_options(app)  # likewise: --config and --tls-* on every command that connects


if __name__ == "__main__":  # pragma: no cover
    app()
