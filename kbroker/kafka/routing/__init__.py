"""Service Broker routing on Kafka: the transmitter, the dispatcher, the forwarder, the links they
send over and the views they report to (docs/routing.md)."""
