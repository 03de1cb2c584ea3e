"""The send-only side of the cross-process group race (tests/integration/test_group_holds.py), run
as its own process: `python -m tests.helpers.group_race_child BOOTSTRAP NAMESPACE SECONDS
GROUPS_JSON OUT [unlocked]`. Two threads SEND, each in a transaction of its own, on conversations
of the given groups for SECONDS and note each hold (group, start, end on the machine's monotonic
clock, which every process shares); OUT gets the holds and the errors as JSON. `unlocked`: with
the statements' group lock removed on purpose. `python -m tests.helpers.group_race_child
BOOTSTRAP NAMESPACE hold HANDLE`: SEND on HANDLE in a transaction, print "held", and keep the
transaction open until killed."""

from __future__ import annotations

import random
import sys
import threading
import time

import orjson

from kbroker.sdk.broker import Broker
from kbroker.sdk.group_locks import GroupLocks
from tests.helpers import invariants as inv


def hold_until_killed(bootstrap: str, namespace: str, handle: str) -> None:
    b = Broker(bootstrap, namespace, lock_timeout=20.0)
    tx = b.transaction()
    tx.send(handle, inv.REQUEST, {"from": "killed"})
    print("held", flush=True)
    time.sleep(600)


def main(argv: list[str]) -> None:
    if argv[2] == "hold":
        hold_until_killed(argv[0], argv[1], argv[3])
        return
    bootstrap, namespace, seconds, groups_json, out = argv[:5]
    if argv[5:] == ["unlocked"]:
        GroupLocks.lock = lambda self, ep, group=None, new=False: None  # type: ignore[method-assign]
    groups: list[list] = orjson.loads(groups_json)  # [[group, [handles...]], ...]
    b = Broker(bootstrap, namespace, lock_timeout=20.0)
    holds: list[dict] = []
    errors: list[str] = []
    lock = threading.Lock()
    stop = threading.Event()

    def sender(idx: int) -> None:
        rng = random.Random(200 + idx)
        try:
            while not stop.is_set():
                g, handles = rng.choice(groups)
                with b.transaction() as tx:
                    tx.send(rng.choice(handles), inv.REQUEST, {"from": "other-process"})
                    start = time.monotonic()
                    time.sleep(rng.uniform(0, 0.03))
                    with lock:
                        holds.append({"group": g, "start": start, "end": time.monotonic(), "who": f"remote-{idx}"})
                time.sleep(rng.uniform(0, 0.05))
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            errors.append(f"{type(exc).__name__}: {exc}")
            stop.set()

    threads = [threading.Thread(target=sender, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    stop.wait(float(seconds))
    stop.set()
    for t in threads:
        t.join(60)
    b.close()
    with open(out, "wb") as f:
        f.write(orjson.dumps({"holds": holds, "errors": errors}))


if __name__ == "__main__":
    main(sys.argv[1:])
