"""Routing trusts nothing it reads, on the real broker: a forged, re-signed or replayed inbound
record is kept in the dead-letter topic with its reason and an event, and the dialog's real
messages are delivered exactly once and in order; garbage on the inbound, acks, transmission and
transport topics leaves the dispatcher, transmitter and views running; an ended dialog's
acknowledgement is tombstoned; a SEND the far side does not grant comes back as Error -8494.
Two namespaces on one broker, with test_routing.py's fixtures."""

from __future__ import annotations

import time
import uuid

import orjson

from kbroker.core import names
from kbroker.core.catalog.models import END_DIALOG, ERROR
from kbroker.core.dialogs.conversation_endpoint import default_group, handle_for
from kbroker.core.dialogs.envelope import H_FOLLOWS, Envelope
from kbroker.core.routing.kept import ROUTING_RECORD_REFUSED
from kbroker.core.routing.signing import sign
from kbroker.kafka import clients
from kbroker.kafka.routing.dispatcher import Dispatcher
from kbroker.kafka.routing.keys import Keys
from kbroker.kafka.routing.transmitter import Transmitter
from kbroker.kafka.routing.views import connection_rows, transmission_rows
from kbroker.kafka.snapshot import read_to_end
from tests.helpers import wait_for
from tests.integration.test_routing import CLIENT, CONTRACT, REQUEST, SERVER, receive_all, two_namespaces
from tests.integration.test_routing import END_DIALOG as _END

assert _END == END_DIALOG


def kept_reasons(bootstrap: str, ns: str) -> list[str]:
    return [
        dict(m.headers() or [])["kb.dlq.reason"].decode()
        for m in read_to_end(bootstrap, names.deadletter_topic(ns)) or []
    ]


def refused_events(bootstrap: str, ns: str) -> list[dict]:
    events = [orjson.loads(m.value()) for m in read_to_end(bootstrap, names.events_topic(ns)) or []]
    return [e for e in events if e.get("event") == ROUTING_RECORD_REFUSED]


def test_forged_and_replayed_inbound_records_are_kept_and_the_dialog_goes_on(kafka_bootstrap, namespace, tmp_path):
    a, b, c = namespace + "a", namespace + "b", namespace + "c"
    with two_namespaces(kafka_bootstrap, tmp_path, a, b) as (ba, bb, services):
        dispatcher = next(s for s in services if isinstance(s, Dispatcher) and s.namespace == b)
        h = ba.begin_dialog(CLIENT, SERVER, CONTRACT)
        for i in range(2):
            ba.send(h, REQUEST, {"i": i})
        assert [m.message_sequence_number for m in receive_all(bb, 2)] == [0, 1]
        conv = ba.endpoints.current(h).conversation_id
        real = [
            m
            for m in read_to_end(kafka_bootstrap, names.inbound_topic(b)) or []
            if m.key() == f"{a}|{conv}|TARGET".encode()
        ]

        def forged(seq: int, mtype: str = REQUEST, sender: str = a) -> tuple[bytes, bytes, list]:
            env = Envelope(
                message_id=str(uuid.uuid4()),
                conversation_id=conv,
                conversation_group_id=default_group(conv, "TARGET"),
                message_sequence_number=seq,
                message_type_name=mtype,
                service_contract_name=CONTRACT,
                from_service_name=CLIENT,
                to_service_name=SERVER,
                to_side="TARGET",
                from_broker=sender,
            )
            return (
                f"{sender}|{conv}|TARGET".encode(),
                b"" if mtype == END_DIALOG else b'{"i": "forged"}',
                env.headers() + [(H_FOLLOWS, b"-1")],
            )

        p = clients.idempotent_producer(kafka_bootstrap)
        inbound = names.inbound_topic(b)
        key, value, headers = forged(2)
        p.produce(inbound, key=key, value=value, headers=headers)  # unsigned: the next number, injected
        key, value, headers = forged(2, END_DIALOG)
        p.produce(inbound, key=key, value=value, headers=headers)  # unsigned: ends the dialog
        key, value, headers = forged(2)  # signed by c's key, claiming to be a
        p.produce(inbound, key=key, value=value, headers=sign(Keys().private(c), key, value, headers, time.time()))
        key, value, headers = forged(2, sender=c)  # c's own signature, on a's dialog
        p.produce(inbound, key=key, value=value, headers=sign(Keys().private(c), key, value, headers, time.time()))
        for m in real:  # replayed as they were: copies of saved messages
            p.produce(inbound, key=m.key(), value=m.value(), headers=m.headers())
        m = real[1]  # replayed, re-declared to follow another message (to pass a gap)
        p.produce(
            inbound,
            key=m.key(),
            value=m.value(),
            headers=[(n, (b"0" if v == b"-1" else b"-1") if n == H_FOLLOWS else v) for n, v in m.headers()],
        )
        p.flush(10)
        for i in range(2, 4):
            ba.send(h, REQUEST, {"i": i})
        got = receive_all(bb, 2)
        assert bb.receive("Q", top=10, wait=2) == []
        assert [(m.message_sequence_number, orjson.loads(m.body)) for m in got] == [(2, {"i": 2}), (3, {"i": 3})]
        wait_for(lambda: dispatcher.kept >= 5, 30, "the dispatcher to keep the forged records")
        assert dispatcher.kept == 5 and dispatcher.duplicates >= len(real)
        reasons = kept_reasons(kafka_bootstrap, b)
        assert sum("unsigned" in r for r in reasons) == 2, reasons
        assert sum(f"not that of namespace '{a}'" in r for r in reasons) == 2, reasons  # c's, and the re-declared
        assert sum(f"belongs to namespace '{a}'" in r for r in reasons) == 1, reasons
        events = refused_events(kafka_bootstrap, b)
        assert len(events) == 5 and {e["claimed_sender"] for e in events} == {a, c}
        assert all(e["topic"] == inbound and e["reader"] == "dispatcher" for e in events)


def test_garbage_on_every_routing_topic_leaves_routing_running(kafka_bootstrap, namespace, tmp_path):
    a, b = namespace + "a", namespace + "b"
    p = clients.idempotent_producer(kafka_bootstrap)
    with two_namespaces(kafka_bootstrap, tmp_path, a, b) as (ba, bb, services):
        # Before the dispatcher's first batch reads the acks topic back, and before A's link reads it.
        p.produce(names.acks_topic(b), key=f"{a}|nothing|TARGET".encode(), value=b"\xff not json")
        p.produce(names.acks_topic(b), key=b"\xfe", value=b'{"next": "x"}')
        p.produce(names.inbound_topic(b), key=b"\x00", value=b"\x01\x02", headers=[("kb.v", b"\xff")])
        p.produce(names.transmission_topic(a), key=b"\xff", value=b"no envelope")
        p.produce(names.link_reports_topic(a), key=b"transmitter/x", value=b'{"at": 1e12, "messages": [1]}')
        p.flush(10)
        h = ba.begin_dialog(CLIENT, SERVER, CONTRACT)
        ba.send(h, REQUEST, {"i": 0})
        [got] = receive_all(bb, 1)
        bb.end_conversation(got.conversation_handle)  # and back: B's transmitter, A's dispatcher
        assert [m.message_type_name for m in receive_all(ba, 1)] == [END_DIALOG]
        wait_for(lambda: len(kept_reasons(kafka_bootstrap, a)) >= 2, 30, "A to keep the bad ack and transmission")
        a_reasons, b_reasons = kept_reasons(kafka_bootstrap, a), kept_reasons(kafka_bootstrap, b)
        assert sum("transmitter refused" in r and "acknowledgement" in r for r in a_reasons) == 1, a_reasons
        assert sum("transmitter refused" in r and "missing header" in r for r in a_reasons) == 1, a_reasons
        assert len(b_reasons) == 1 and "dispatcher refused" in b_reasons[0], b_reasons
        assert len(refused_events(kafka_bootstrap, a)) == 2 and len(refused_events(kafka_bootstrap, b)) == 1
        for s in services:
            assert s.denied is None and s._thread.is_alive()
        assert all(s.kept == (1 if s.namespace == b else 0) for s in services if isinstance(s, Dispatcher))
        transmission_rows(kafka_bootstrap, a, timeout=5)  # the views skip the report that is none
        assert all(r["transmitter"] != "x" for r in connection_rows(kafka_bootstrap, a, timeout=5))


def test_an_ended_dialogs_acknowledgements_are_tombstoned(kafka_bootstrap, namespace, tmp_path):
    a, b = namespace + "a", namespace + "b"
    with two_namespaces(kafka_bootstrap, tmp_path, a, b, dispatcher_kw={"forget_after": 1.0}) as (ba, bb, services):
        h = ba.begin_dialog(CLIENT, SERVER, CONTRACT)
        ba.send(h, REQUEST, {"i": 0})
        [got] = receive_all(bb, 1)
        bb.end_conversation(got.conversation_handle)
        assert [m.message_type_name for m in receive_all(ba, 1)] == [END_DIALOG]
        ba.end_conversation(h)
        conv = got.conversation_id

        def last(ns: str, key: str) -> list:
            return [
                m.value() for m in read_to_end(kafka_bootstrap, names.acks_topic(ns)) or [] if m.key() == key.encode()
            ]

        wait_for(lambda: last(b, f"{a}|{conv}|TARGET")[-1:] == [None], 30, "B's ack of A's direction tombstoned")
        wait_for(lambda: last(a, f"{b}|{conv}|INITIATOR")[-1:] == [None], 30, "A's ack of B's direction tombstoned")
        ended = orjson.loads(last(b, f"{a}|{conv}|TARGET")[-2])
        assert ended["next"] == 2 and ended["ended"] > 0  # the request and the EndDialog
        assert all(s.forgotten == 1 for s in services if isinstance(s, Dispatcher))
        assert all(len(s.queue) == 0 for s in services if isinstance(s, Transmitter))


def test_a_send_to_a_service_the_far_side_does_not_grant_comes_back_as_error_8494(kafka_bootstrap, namespace, tmp_path):
    a, b = namespace + "a", namespace + "b"
    with two_namespaces(kafka_bootstrap, tmp_path, a, b, server_extra=", remote_senders: [somebody]") as (ba, bb, _):
        h = ba.begin_dialog(CLIENT, SERVER, CONTRACT)
        ba.send(h, REQUEST, {"i": 0})
        [m] = receive_all(ba, 1)
        assert m.message_type_name == ERROR and m.conversation_handle == h
        assert b"<Code>-8494</Code>" in m.body and b"permission to access the service" in m.body, m.body
        assert bb.receive("Q", top=10, wait=2) == []
        assert handle_for(m.conversation_id, "INITIATOR") == h
