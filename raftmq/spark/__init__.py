"""Spark readers of committed raftmq logs (PySpark's Python Data Source API).

    import raftmq.spark                      # registers "raftmq" with the active session
    raftmq.spark.register(spark)             # or explicitly, e.g. before any session exists

Needs the ``spark`` extra (``pip install 'raftmq[spark]'``: pyspark 4.2+ and pyarrow).
See docs/spark.md for the options.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from raftmq.spark.options import SourceError
from raftmq.spark.source import RaftmqDataSource

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def register(spark: SparkSession | None = None) -> None:
    """Make ``format("raftmq")`` known to ``spark`` (default: the active session)."""
    from pyspark.sql import SparkSession

    session = spark or SparkSession.getActiveSession()
    if session is None:
        raise RuntimeError("no active SparkSession: create one, then call register(spark)")
    session.dataSource.register(RaftmqDataSource)


def _register_with_active_session() -> None:
    """At import: register with the session that is running, if any. Executors import
    this package too (to unpickle partitions); they have no session, so nothing happens."""
    from pyspark import SparkContext

    if SparkContext._active_spark_context is not None:  # the driver, with a running JVM
        register()


_register_with_active_session()

__all__ = ["RaftmqDataSource", "SourceError", "register"]
