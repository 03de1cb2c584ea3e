"""The benchmark's scenarios, each beside its baseline; they register themselves on import."""
