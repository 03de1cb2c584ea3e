"""Analytics' pure rules: stale messages, dialog classes, the analytics topic's records decoded."""
