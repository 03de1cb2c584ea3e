"""DROP of a catalog object with what it does to open dialogs: DROP SERVICE ends every open
conversation of the service, the far side getting Service Broker's Error -8470 "Remote service
has been dropped." and this side's endpoint CLOSED (core/dialogs/send_records.py), and then the
service leaves the catalog (kafka/catalog/drop.py). Every other kind has no dialogs to end.

The dialogs are ended before the tombstone is written, each as END CONVERSATION is, holding the
conversation; then the endpoints are looked at once more, and one begun meanwhile is ended too.
A dialog begun in the moment between that look and the tombstone reaching the process that
begins it is not ended (Service Broker's DROP is one transaction; docs/catalog.md)."""

from __future__ import annotations

from kbroker.core.catalog.drops import check_drop
from kbroker.core.cluster import ClusterLike
from kbroker.core.dialogs.conversation_endpoint import CLOSED
from kbroker.kafka.catalog.drop import DropReport, drop_object
from kbroker.sdk.broker import Broker


def end_service_dialogs(broker: Broker, service: str) -> list[str]:
    """Close every open endpoint of `service` as DROP SERVICE does; returns their handles."""
    rt = broker.runtime
    ended: list[str] = []
    for ep in sorted(rt.endpoints.all(), key=lambda e: e.conversation_handle):
        if ep.service_name != service or ep.state == CLOSED:
            continue
        handle = ep.conversation_handle
        with broker._conversation(handle) as produce:
            current = rt.endpoints.current(handle)
            if current.state == CLOSED:
                continue
            records, closed = rt.statements.service_dropped_records(current)
            for record in records:
                produce(record)
            produce(rt.statements.endpoint_record(handle, closed))
            rt.endpoints.note(handle, closed)
        ended.append(handle)
    return ended


def drop(
    cluster: ClusterLike, namespace: str, kind: str, name: str, *, delete_topics: bool = False, timeout: float = 30.0
) -> DropReport:
    """DROP KIND NAME in `namespace` (KIND of core/catalog/drops.DROP_KINDS): refused, before
    anything changes, as check_drop says; a service's open dialogs are ended first."""
    if kind != "service":
        return drop_object(cluster, namespace, kind, name, delete_topics=delete_topics, timeout=timeout)
    with Broker(cluster, namespace) as broker:
        catalog = broker.refresh_catalog()
        check_drop(catalog, kind, name)
        ended = end_service_dialogs(broker, name)
        report = drop_object(cluster, namespace, kind, name, timeout=timeout, catalog=catalog)
        ended += end_service_dialogs(broker, name)
    report.dialogs_ended = ended
    return report
