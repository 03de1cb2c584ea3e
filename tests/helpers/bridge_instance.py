"""One started instance of an endpoint that bridges to another cluster, in a process of its own
(for kill -9 tests): its pusher moves what waits in the namespace's bridge topic to `FAR`.

    python -m tests.helpers.bridge_instance BOOTSTRAP NAMESPACE FAR_NAME FAR_BOOTSTRAP MACHINE

It runs until SIGTERM (then it closes the endpoint); SIGKILL leaves its far transaction to be
fenced by the next pusher."""

from __future__ import annotations

import signal
import sys
import threading


def main(bootstrap: str, namespace: str, far_name: str, far: str, machine: str) -> None:
    from kbroker.sdk.transport.endpoint import TransportEndpoint

    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    ep = TransportEndpoint(
        "Sales", cluster=bootstrap, namespace=namespace, machine=machine, bridges={far_name: far}, secondary=False
    )
    ep.start(lambda msg, tx: None)
    print("started", flush=True)
    done.wait()
    ep.close()


if __name__ == "__main__":
    main(*sys.argv[1:6])
