"""Spark Structured Streaming beside the broker (docs/analytics.md): the only pyspark importer."""
