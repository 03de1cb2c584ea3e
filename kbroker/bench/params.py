"""The benchmark's sizes and settings, with their defaults: one place for the harness and the
`kbroker bench` options (a module of its own, so the CLI reads the defaults without loading the
harness)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Params:
    repeat: int = 5  # medians of 5, with the run-to-run range beside them (issue 26)
    messages: int = 20_000  # send, request-reply, transport; transport-publish: events
    conversations: int = 1_000
    backlog: int = 1_000_000
    readers: int = 64  # request-reply: kbroker responder threads
    in_flight: int = 1  # request-reply: requests in flight per dialog
    body_bytes: int = 100
    samples: int = 20  # activation-latency: first-message latencies per repetition
    drain_messages: int = 100_000  # activation-drain: the backlog drained per side and repetition
    max_readers: int = 4  # activation-drain: max_queue_readers, and the fixed pool's size
    ramp_up: float = 5.0  # activation-*: the worker's --ramp-up (SSB's 5 s)
    ended_dialogs: int = 1_000_000  # ended-dialogs: dialogs whose endpoints the namespace holds
    delayed_messages: int = 100_000  # transport-delayed: delayed messages per side and repetition
    delayed_seconds: float = 600.0  # transport-delayed: the window their due times are spread over
    outbox_messages: int = 5_000  # transport-outbox: messages per side and repetition
