"""ALTER MESSAGE TYPE on the real broker: a validation tightened by a later apply refuses new
SENDs that break it, and the messages already queued are still received, not dead-lettered."""

from __future__ import annotations

from pathlib import Path

import pytest

from kbroker.errors import MessageValidationError
from kbroker.kafka.catalog.apply import apply_paths
from kbroker.sdk.broker import Broker

CATALOG = """
message_types:
  - {{name: //alter/M, validation: {validation}}}
contracts:
  - {{name: //alter/C, messages: [{{type: //alter/M, sent_by: INITIATOR}}]}}
queues: [{{name: AlterIn}}, {{name: AlterOut}}]
services:
  - {{name: //alter/From, queue: AlterOut}}
  - {{name: //alter/To, queue: AlterIn, contracts: [//alter/C]}}
"""


def test_a_tightened_validation_spares_the_messages_already_queued(kafka_bootstrap, namespace, tmp_path: Path):
    path = tmp_path / "alter.yaml"
    path.write_text(CATALOG.format(validation="NONE"))
    apply_paths(kafka_bootstrap, namespace, [path])
    with Broker(kafka_bootstrap, namespace) as b:
        h = b.begin_dialog("//alter/From", "//alter/To", "//alter/C")
        b.send(h, "//alter/M", b"not json")  # valid under NONE
        path.write_text(CATALOG.format(validation="JSON"))
        apply_paths(kafka_bootstrap, namespace, [path])
        b.refresh_catalog()
        assert b.catalog.message_types["//alter/M"].earlier[0].validation == "NONE"
        with pytest.raises(MessageValidationError):
            b.send(h, "//alter/M", b"still not json")  # a new SEND meets the new validation
        b.send(h, "//alter/M", {"now": "json"})
        got = b.receive("AlterIn", top=10, wait=15)
        got += [] if len(got) == 2 else b.receive("AlterIn", top=10, wait=15)
        assert [m.body for m in got] == [b"not json", b'{"now":"json"}']
        assert b.queue_messages("AlterIn") == []
