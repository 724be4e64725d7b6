"""A local SparkSession set up the way raftmq's tests, benchmark and examples need it, with
the ``raftmq`` source registered. Production jobs build their own session (spark-submit
on a cluster) and call :func:`raftmq.spark.register`."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

IMPORT_ROOT = Path(__file__).resolve().parents[2]
"""The folder holding the ``raftmq`` package: a checkout, or site-packages."""


def local_session(app_name: str, *, master: str = "local[2]") -> SparkSession:
    """``master`` on loopback, UI off, UTC. Spark starts its Python workers with whatever
    ``python3`` is on PATH and passes its own environment on: so this interpreter and this
    checkout's raftmq (importable without installing it) are set before the JVM starts."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    paths = [str(IMPORT_ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    from pyspark.sql import SparkSession

    from raftmq.spark import register

    spark = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark
