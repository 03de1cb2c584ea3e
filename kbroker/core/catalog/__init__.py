"""The catalog: message types, XML schema collections, contracts, services, queues, routes and their
rules, read from YAML and validated as a whole; the catalog topic's records decoded (pure)."""
