"""A program for the external activator to start: it drains its queue and exits when the queue is
empty, as an External Activator application does (SSB: "RECEIVE from the user queue, exit when
it is empty"). The activator sets KBROKER_BOOTSTRAP, KBROKER_NAMESPACE and KBROKER_QUEUE.

Prints one JSON line per message on stdout (the activator sends it to its stderr).
READER_WAIT: seconds a RECEIVE waits for messages before the queue counts as empty (default 2).
"""

from __future__ import annotations

import json
import os
import sys

import kbroker
from kbroker import END_DIALOG, ERROR_TYPE


def main() -> int:
    queue = os.environ["KBROKER_QUEUE"]
    wait = float(os.environ.get("READER_WAIT", "2"))
    with kbroker.connect() as broker:  # KBROKER_BOOTSTRAP / KBROKER_NAMESPACE
        while True:
            # One transaction per batch: if we crash before commit, the messages come back.
            with broker.transaction() as tx:
                msgs = tx.receive(queue, top=10, wait=wait)
                if not msgs:
                    return 0
                for m in msgs:
                    if m.message_type_name in (END_DIALOG, ERROR_TYPE):
                        tx.end_conversation(m.conversation_handle)
                    print(
                        json.dumps(
                            {
                                "pid": os.getpid(),
                                "queue": queue,
                                "message_id": m.message_id,
                                "type": m.message_type_name,
                                "body": m.text,
                            }
                        ),
                        flush=True,
                    )


if __name__ == "__main__":
    sys.exit(main())
