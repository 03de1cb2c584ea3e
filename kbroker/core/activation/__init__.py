"""Activation: the queue monitor's state machine and its events on the wire, the cluster tick, ramp-up of polling readers (pure)."""
