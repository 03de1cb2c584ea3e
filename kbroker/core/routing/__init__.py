"""Service Broker routing, pure: routes, the links to other brokers, the transmission queue, the
dispatcher's ordering and the forwarder's memory (docs/routing.md)."""
