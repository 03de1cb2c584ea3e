"""Activation: the queue monitor's state machine, its state, events and their wire form, the
cluster tick, ramp-up of polling readers (pure). See docs/activation.md."""
