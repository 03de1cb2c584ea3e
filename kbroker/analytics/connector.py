"""Spark's Kafka source (spark-sql-kafka-0-10_2.13) at the installed pyspark's version, resolved
with Maven into kbroker's cache beside the broker's jars (kbroker.embedded.jvm.fetch_maven_jars)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from kbroker import config
from kbroker.embedded.jvm import fetch_maven_jars

HERE = Path(__file__).resolve().parent
# What pyspark does not ship of the connector's runtime jars (the rest it has, at its own versions).
MISSING_FROM_PYSPARK = (
    "spark-sql-kafka-0-10_2.13",
    "spark-token-provider-kafka-0-10_2.13",
    "kafka-clients",
    "commons-pool2",
)


def spark_version() -> str:
    import pyspark

    return pyspark.__version__


def connector_jars(say: Callable[[str], None] = lambda _msg: None) -> list[Path]:
    """The jars to add to Spark's classpath (spark.jars), fetched on first use."""
    version = spark_version()
    libs = fetch_maven_jars(
        HERE / "pom.xml",
        config.cache_dir() / f"spark-kafka-{version}",
        f"Spark's Kafka source {version}",
        "spark-sql-kafka-0-10_2.13-*.jar",
        say,
        maven_args=(f"-Dspark.version={version}", f"-DincludeArtifactIds={','.join(MISSING_FROM_PYSPARK)}"),
    )
    return sorted(libs.glob("*.jar"))
