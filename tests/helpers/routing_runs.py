"""The replying process of the cross-namespace invariant run (tests/integration/test_routing_clusters.py).

`python -m tests.helpers.routing_runs replier BOOTSTRAP NAMESPACE STOP_FILE LOG_FILE` RECEIVEs
requests from queue Q and answers each with one reply on its dialog, in the RECEIVE's transaction,
until STOP_FILE exists. It holds the send leases of the dialogs it answers, which is what a kill -9
or a broker outage longer than a lease must not turn into a stalled dialog. Any failure of one
transaction (the broker gone, a rebalance, a fenced commit) is logged and the loop goes on: what the
transaction received comes back, and nothing it sent is visible."""

from __future__ import annotations

import os
import sys
import time

REPLY = "//Demo/Reply"


def replier_process(bootstrap: str, namespace: str, stop_file: str, log_file: str) -> None:
    from kbroker.errors import KBrokerError
    from kbroker.sdk.broker import Broker

    broker = Broker(bootstrap, namespace)
    with open(log_file, "a", buffering=1) as log:
        log.write(f"replier {os.getpid()} started\n")
        while not os.path.exists(stop_file):
            try:
                with broker.transaction() as tx:
                    for m in tx.receive("Q", top=20, wait=0.5):
                        tx.send(m.conversation_handle, REPLY, {"request": m.message_id, "body": m.body.decode()})
            except KBrokerError as exc:
                log.write(f"{time.time():.1f} {type(exc).__name__}: {exc}\n")
                time.sleep(0.5)
    broker.close()


if __name__ == "__main__":
    if sys.argv[1] == "replier":
        replier_process(*sys.argv[2:6])
