"""The external activator: starts your programs when the worker says a queue needs readers.

Like SQL Server's Service Broker External Activator (EAService): a config file names, per queue,
a command and how many copies of it may run; QUEUE_ACTIVATION events on the namespace's events
topic start them. `config` reads the file, `notification` parses events, `rules` decides (pure,
no clock of its own), `runner` is the Kafka and subprocess adapter.
"""
