"""G3 across a broker restart: a SEND that returned survives `broker stop` and `broker start`,
and so does the conversation endpoint it updated."""

from __future__ import annotations

import orjson

from kbroker.cli.demo import CLAIM, CONTRACT
from kbroker.cli.demo import EMPLOYEES as EMP
from kbroker.cli.demo import EXPENSES as EXP
from kbroker.embedded.broker import EmbeddedBroker
from kbroker.kafka.catalog.apply import apply_paths
from kbroker.sdk.broker import Broker
from tests.helpers import SAMPLES, free_port


def test_sent_before_stop_is_received_after_start(tmp_path, namespace):
    embedded = EmbeddedBroker(tmp_path / "kafka")
    port = free_port()
    bootstrap = embedded.start(port=port, controller_port=free_port()).bootstrap
    try:
        apply_paths(bootstrap, namespace, [SAMPLES])
        with Broker(bootstrap, namespace) as b:
            handle = b.begin_dialog(EMP, EXP, CONTRACT)
            sent = [b.send(handle, CLAIM, {"n": i}) for i in range(3)]
        assert embedded.stop() is True
        assert not embedded.status().running

        bootstrap = embedded.start(port=port, controller_port=free_port()).bootstrap
        with Broker(bootstrap, namespace) as b:
            msgs = b.receive("ExpenseQueue", top=10, wait=30)
            assert [m.message_id for m in msgs] == sent
            assert [orjson.loads(m.body)["n"] for m in msgs] == [0, 1, 2]
            # The initiator endpoint came back from the compacted topic, with its sequence.
            ep = b.endpoints.get(handle)
            assert ep.state == "CO" and ep.send_sequence == 3
            b.send(handle, CLAIM, {"n": 3})
            assert b.receive("ExpenseQueue", top=10, wait=30)[0].message_sequence_number == 3
    finally:
        embedded.stop()
