"""Dialogs between two Kafka clusters (the session's broker and one of the test's own), carried by
real `kbroker worker`s: exactly once and in per-dialog order through kill -9 of either side's
worker, and through the remote broker stopped mid-run, where the messages wait with a status and
the transport's suppression (15 s after a disconnect, 60 s after a failed attempt) is measured."""

from __future__ import annotations

import signal
import threading
import time
import uuid
from collections import defaultdict

import httpx
import pytest

from kbroker.embedded.broker import EmbeddedBroker
from kbroker.errors import TransactionAbortedError
from kbroker.sdk.broker import Broker
from tests.helpers import free_port, wait_for
from tests.integration.test_routing import CLIENT, CONTRACT, REQUEST, SERVER, kbroker_json, setup_catalogs
from tests.integration.test_worker import Worker

DIALOGS, PER = 16, 4


class Sent:
    """What A sent, per dialog, in the order sent."""

    def __init__(self) -> None:
        self.bodies: dict[str, list[str]] = defaultdict(list)

    def dialogs(self, broker: Broker, n: int, pause: float = 0.0) -> None:
        for d in range(n):
            with broker.transaction() as tx:
                h = tx.begin_dialog(CLIENT, SERVER, CONTRACT)
                conv = tx.endpoint(h).conversation_id
                for i in range(PER):
                    body = f'{{"c":"{conv[:8]}","i":{i}}}'
                    tx.send(h, REQUEST, body)
                    self.bodies[conv].append(body)
            time.sleep(pause)


class Received:
    """Everything B received, checked for order and duplicates."""

    def __init__(self) -> None:
        self.by_conv: dict[str, list[tuple[int, str]]] = defaultdict(list)
        self.ids: list[str] = []

    def take(self, broker: Broker) -> int:
        try:
            got = broker.receive("Q", top=100, wait=1)
        except TransactionAbortedError:  # a broker that just restarted: the messages come back
            return 0
        for m in got:
            self.by_conv[m.conversation_id].append((m.message_sequence_number, m.body.decode()))
            self.ids.append(m.message_id)
        return len(got)

    def count(self) -> int:
        return len(self.ids)

    def check(self, sent: Sent) -> None:
        duplicates = len(self.ids) - len(set(self.ids))
        order = [c for c, msgs in self.by_conv.items() if [s for s, _ in msgs] != list(range(len(msgs)))]
        lost = {c: len(b) - len(self.by_conv.get(c, [])) for c, b in sent.bodies.items()
                if len(self.by_conv.get(c, [])) != len(b)}
        wrong = [c for c, msgs in self.by_conv.items() if [b for _, b in msgs] != sent.bodies.get(c)]
        assert (duplicates, order, lost, wrong) == (0, [], {}, []), \
            f"duplicates {duplicates}, out of order {order}, lost {lost}, bodies differ {wrong}"


@pytest.mark.timeout(600)  # the 60 s suppression after a failed attempt is waited out
def test_across_clusters_through_kill9_of_both_workers_and_a_remote_broker_outage(kafka_bootstrap, tmp_path):
    remote = EmbeddedBroker(tmp_path / "remote-kafka")
    port, cport = free_port(), free_port()
    remote_bootstrap = remote.start(port=port, controller_port=cport).bootstrap
    assert remote_bootstrap is not None
    a, b = "ra" + uuid.uuid4().hex[:8], "rb" + uuid.uuid4().hex[:8]
    workers: list[Worker] = []
    try:
        setup_catalogs(kafka_bootstrap, tmp_path, a, b, b_bootstrap=remote_bootstrap)
        wa, wb = Worker(kafka_bootstrap, a, tmp_path), Worker(remote_bootstrap, b, tmp_path)
        workers += [wa, wb]
        wa.wait_ready()
        wb.wait_ready()
        ba, bb = Broker(kafka_bootstrap, a), Broker(remote_bootstrap, b)
        sent, received = Sent(), Received()

        # 1. kill -9 of A's worker, then of B's, while dialogs flow.
        sending = threading.Thread(target=sent.dialogs, args=(ba, DIALOGS, 0.3))
        sending.start()
        wait_for(lambda: received.take(bb) >= 0 and received.count() >= PER * 2, 90, "first messages at B")
        wa.stop(signal.SIGKILL)
        wa = Worker(kafka_bootstrap, a, tmp_path)
        workers.append(wa)
        wait_for(lambda: received.take(bb) >= 0 and received.count() >= PER * 6, 120,
                 f"messages after A's worker was killed ({wa.log})")
        wb.stop(signal.SIGKILL)
        wb = Worker(remote_bootstrap, b, tmp_path)
        workers.append(wb)
        sending.join()
        wait_for(lambda: received.take(bb) >= 0 and received.count() >= DIALOGS * PER, 180,
                 f"every message at B after both kills ({wa.log}, {wb.log})")
        time.sleep(3)
        received.take(bb)
        received.check(sent)

        # 2. The remote broker goes away: A's messages wait with a status; the link is suppressed
        # 15 s after the disconnect and 60 s after the failed attempt; nothing lost or doubled.
        remote.stop()
        stopped = time.time()
        sent.dialogs(ba, 4)
        rows = wait_for(lambda: [r for r in kbroker_json("transmission", kafka_bootstrap, a)
                                 if r["transmission_status"]] or None, 60, "statuses while B's broker is down")
        assert all(b in r["transmission_status"] for r in rows), rows
        time.sleep(max(0.0, stopped + 25 - time.time()))
        remote.start(port=port, controller_port=cport)
        wait_for(lambda: received.take(bb) >= 0 and received.count() >= (DIALOGS + 4) * PER, 180,
                 f"every message at B after its broker came back ({wa.log}, {wb.log})")
        time.sleep(3)
        received.take(bb)
        received.check(sent)

        [link] = [r for r in kbroker_json("connections", kafka_bootstrap, a) if r["destination"].endswith("/" + b)]
        events = [(t, e) for t, e in link["history"] if t >= stopped - 1]
        kinds = [e for _, e in events]
        assert "DISCONNECTED" in kinds and "FAILED" in kinds and kinds[-1] == "CONNECTED", events
        disconnect = next(t for t, e in events if e == "DISCONNECTED")
        attempts = [t for t, e in events if e == "CONNECTING"]
        failed = [t for t, e in events if e == "FAILED"]
        first_after = min(t for t in attempts if t > disconnect)
        next_after_fail = min(t for t in attempts if t > failed[0])
        print(f"suppression measured: {first_after - disconnect:.1f} s after the disconnect, "
              f"{next_after_fail - failed[0]:.1f} s after the failed attempt")
        assert first_after - disconnect >= 15.0, events
        assert next_after_fail - failed[0] >= 60.0, events
        for w in (wa, wb):
            assert w.proc.poll() is None, w.log.read_text()[-3000:]
            httpx.get(w.url + "/tasks/", timeout=5).raise_for_status()
        ba.close()
        bb.close()
    finally:
        for w in workers:
            w.stop()
        remote.stop()
