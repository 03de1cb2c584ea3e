"""The keys in queue topic names (core/names.py), as `kbroker apply` sets and checks them: a queue
new to the namespace gets encoded_key of its name, one applied before keeps the key it
has, whether encoded or from before keys existed (its name)."""

from __future__ import annotations

from kbroker.core import names
from kbroker.core.catalog.catalog import Catalog
from kbroker.core.topic_keys import encoded_key
from kbroker.errors import DefinitionError


def stamp_keys(catalog: Catalog, previous: Catalog) -> Catalog:
    """`catalog` (from definition files) with every queue's key: `previous`'s (the published
    catalog) for a queue it has, else encoded. Remembered for this process's topic names."""
    queues = {}
    for name, q in catalog.queues.items():
        old = previous.queues.get(name)
        key = old.topic_key if old is not None and old.topic_key else encoded_key(name)
        queues[name] = q if q.topic_key == key else q.model_copy(update={"topic_key": key})
    names.remember_keys(catalog.namespace, {name: q.topic_key for name, q in queues.items() if q.topic_key})
    return catalog.model_copy(update={"queues": queues})


def check_queue_keys(catalog: Catalog, previous: Catalog) -> None:
    """DefinitionError when a queue of `catalog` (keys stamped) would share a topic, or one Kafka
    refuses beside it, with another of its queues or one `previous` holds
    (names.queue_names_collide on the keys). Encoded keys never meet: only a key kept from
    before keys existed can. Collisions among the queues applied earlier alone are not this
    apply's to report."""
    # Every key is set: stamp_keys stamped `catalog`'s, and the reader (published_key) `previous`'s.
    new = {name: str(q.topic_key) for name, q in catalog.queues.items()}
    earlier = [(name, str(q.topic_key)) for name, q in previous.queues.items() if name not in new]
    for name, key in new.items():
        for other, other_key in earlier:
            reason = names.queue_names_collide(key, other_key)
            if reason is not None:
                when = " (applied earlier)" if other not in new else ""
                raise DefinitionError(
                    catalog.origins.get(f"queue {name}"),
                    f"queue {name}",
                    f"its topic key {key!r} collides with queue {other!r}'s {other_key!r}{when}: {reason}",
                )
        earlier.append((name, key))
