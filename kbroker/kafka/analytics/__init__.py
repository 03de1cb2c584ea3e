"""What the analytics path writes to Kafka and reads back besides Spark's own source."""
