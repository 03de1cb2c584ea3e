"""What the transmitter (kafka/routing/transmitter.py) tells its own namespace, through its local
producer: broker configuration notices and TRANSMISSION_STALLED events (events topic), the Error
a refused dialog gets on its queue, and the records it sets aside (dead-letter topic). Apart from
the transmitter's reading, sending and acknowledging; it only writes here.
"""

from __future__ import annotations

import logging
from typing import Any

import orjson
from confluent_kafka import Producer

from kbroker.core import names
from kbroker.core.catalog.models import ERROR as ERROR_TYPE
from kbroker.core.dialogs.envelope import Envelope, error_body
from kbroker.core.dialogs.timers import system_message
from kbroker.core.routing.kept import kept
from kbroker.core.routing.transmission import Outgoing, Refusal
from kbroker.kafka import clients, messages

log = logging.getLogger("kbroker.transmitter")  # the transmitter's log: these are its messages
NOTICE_EVERY = 60.0  # a missing route's broker configuration notice, per service


class Notices:
    """The transmitter's writes to its namespace, on `producer` (the transmitter flushes it);
    `component` names it in the records it sets aside."""

    def __init__(self, producer: Producer, namespace: str, component: str):
        self._local, self.namespace, self._component = producer, namespace, component
        self._noticed: dict[str, float] = {}  # service -> when its missing route was last noticed

    def refused(self, m: Outgoing, refusal: Refusal, queue: str) -> None:
        """The far side refused `m`'s dialog: the Error goes to this side's queue (as Service
        Broker delivers the far broker's Error)."""
        side = "INITIATOR" if m.to_side == "TARGET" else "TARGET"
        sent = Envelope.from_headers(m.record[1])
        group = sent.reply_group or m.conversation_id  # the key this side's records carry (_record)
        topic = (
            names.queue_topic(self.namespace, queue)
            if sent.reply_instance is None
            else names.secondary_queue_topic(self.namespace, queue, sent.reply_instance)
        )
        _, key, value, headers = system_message(
            m.conversation_id,
            side,
            m.contract,
            m.from_service,
            m.to_service,
            topic,
            group,
            ERROR_TYPE,
            error_body(refusal.code, refusal.description),
        )
        clients.produce(self._local, topic, key=key, value=value, headers=messages.wire_headers(headers))
        self._local.poll(0)
        log.warning(
            "dialog %s refused by %s (%d): %s",
            m.conversation_id,
            m.destination or "its destination",
            refusal.code,
            refusal.description,
        )

    def keep(self, msg: Any, why: str) -> None:
        """A record of the transmission topic, or of an acks topic, that is not what it should
        be: kept in this namespace's dead-letter topic, with an event (core/routing/kept.py)."""
        log.warning("%s[%s]@%s set aside: %s", msg.topic(), msg.partition(), msg.offset(), why)
        for topic, key, value, headers in kept(self.namespace, msg, why, self._component):
            clients.produce(self._local, topic, key=key, value=value, headers=messages.wire_headers(headers))
        self._local.poll(0)

    def stalled(self, m: Outgoing, now: float) -> None:
        """A dialog direction whose oldest message, `m`, went unacknowledged too long: a
        TRANSMISSION_STALLED event on the events topic and a warning naming the conversation;
        its status stays in `kbroker transmission`."""
        event = {
            "event": "TRANSMISSION_STALLED",
            "namespace": self.namespace,
            "conversation_id": m.conversation_id,
            "conversation_handle": m.handle,
            "to_service_name": m.to_service,
            "destination": m.destination,
            "message_sequence_number": m.sequence,
            "attempts": m.attempts,
            "first_sent": m.first_sent,
            "transmission_status": m.status,
            "time": int(now * 1000),
        }
        clients.produce(
            self._local,
            names.events_topic(self.namespace),
            key=m.conversation_id.encode(),
            value=orjson.dumps(event),
        )
        self._local.poll(0)
        log.warning(
            "dialog %s to %s makes no progress: message %d sent %d time(s) since %.0f s ago: %s",
            m.conversation_id,
            m.to_service,
            m.sequence,
            m.attempts,
            now - (m.first_sent or now),
            m.status,
        )

    def notice(self, now: float, reason: str, service: str | None = None, broker: str | None = None) -> None:
        """A broker configuration notice (BCN) on the events topic, for whoever provides routes
        (Service Broker sends it to the BrokerConfiguration service): when the transmitter starts
        and when a service has no route, at most once a minute per service."""
        if service is not None:
            if now - self._noticed.get(service, -1e9) < NOTICE_EVERY:
                return
            self._noticed[service] = now
        event = {
            "event": "BROKER_CONFIGURATION_NOTICE",
            "namespace": self.namespace,
            "reason": reason,
            "service": service,
            "broker_instance": broker,
            "time": int(now * 1000),
        }
        clients.produce(self._local, names.events_topic(self.namespace), key=b"bcn", value=orjson.dumps(event))
        self._local.poll(0)
        log.info("broker configuration notice: %s%s", reason, f" for service {service}" if service else "")

    def forget(self, now: float) -> None:
        """Forget the notices older than a minute (a 2nd-tick task)."""
        self._noticed = {s: at for s, at in self._noticed.items() if now - at < NOTICE_EVERY}
