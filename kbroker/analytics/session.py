"""The SparkSession the analytics job runs in: Spark's Kafka source on the classpath, and settings
sized for small micro-batches (docs/analytics.md)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Callable

from pyspark.sql import SparkSession

from kbroker.analytics.connector import connector_jars

# Before the first start: a query's checkpoint fixes its shuffle partitions, and Spark's default of
# 200 made a 50-row batch take 8.7 s on two cores, longer than the trigger.
DEFAULTS = {
    "spark.sql.shuffle.partitions": "2",
    "spark.ui.enabled": "false",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.streaming.stopTimeout": "30s",  # query.stop() waits this long for a batch at most
    "spark.ui.showConsoleProgress": "false",  # a progress bar on stderr per stage: the job logs its batches
    # How long the driver's JVM waits for Python to fetch a batch's rows (15 s by default): on a
    # loaded machine the wait ran out, the batch failed and the query with it.
    "spark.python.authenticate.socketTimeout": "120s",
}
LOCAL = {"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1"}
LOG_CONFIG = Path(__file__).resolve().parent / "log4j2.properties"


def spark_session(
    master: str = "local[*]",
    conf: dict[str, str] | None = None,
    *,
    app_name: str = "kbroker-analytics",
    say: Callable[[str], None] = lambda _m: None,
    java_options: Sequence[str] = (),
) -> Any:
    """A session with the connector's jars (fetched with Maven on first use). `conf` wins over the
    defaults; for a cluster, set the master and Spark's usual settings there. `java_options`:
    JVM options the driver and executors need beside the log configuration."""
    jars = ",".join(str(j) for j in connector_jars(say))
    if master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # else a warning about the hostname
    builder = SparkSession.builder.master(master).appName(app_name)
    settings = {
        **DEFAULTS,
        **(LOCAL if master.startswith("local") else {}),
        "spark.jars": jars,
        "spark.driver.extraJavaOptions": " ".join([f"-Dlog4j.configurationFile=file:{LOG_CONFIG}", *java_options]),
        **({"spark.executor.extraJavaOptions": " ".join(java_options)} if java_options else {}),
        **(conf or {}),
    }
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")  # kbroker logs each batch; Spark's warnings are noise here
    return spark
