"""XML schema collections on the real broker: a catalog with a collection read from an XSD file is
applied and read back with the XSD's text; SEND takes a body valid against it and refuses an
invalid one with the schema's error (-9615) before anything is written; and a message whose
sender does not validate it (another namespace's catalog says NONE) is refused where it arrives:
the sender gets Service Broker's Error -9615 naming the schema's error, the target nothing."""

from __future__ import annotations

import textwrap

import orjson
import pytest
from defusedxml import ElementTree as SafeET

from kbroker.core.catalog.models import ERROR
from kbroker.errors import MessageValidationError
from kbroker.kafka.catalog.apply import apply_paths
from kbroker.kafka.catalog.catalog_store import read_catalog
from kbroker.sdk.broker import Broker
from tests.integration.test_routing import CLIENT, CONTRACT, REQUEST, SERVER, receive_all, two_namespaces

ORDERS_XSD = textwrap.dedent(
    """\
    <?xml version="1.0" encoding="UTF-8"?>
    <xsd:schema xmlns:xsd="http://www.w3.org/2001/XMLSchema" targetNamespace="urn:orders"
                xmlns="urn:orders" elementFormDefault="qualified">
      <xsd:element name="order">
        <xsd:complexType>
          <xsd:sequence>
            <xsd:element name="id" type="xsd:int"/>
            <xsd:element name="item" type="xsd:string" maxOccurs="unbounded"/>
          </xsd:sequence>
        </xsd:complexType>
      </xsd:element>
    </xsd:schema>
    """
)
VALID = b'<order xmlns="urn:orders"><id>1</id><item>tea</item></order>'
INVALID = b'<order xmlns="urn:orders"><item>tea</item></order>'  # no <id>
SCHEMA_ERROR = "Tag '{urn:orders}id' expected"
SB_ERROR = "http://schemas.microsoft.com/SQL/ServiceBroker/Error"

LOCAL = """
xml_schema_collections:
  - {name: Orders, files: [schemas/orders.xsd]}
message_types:
  - {name: //Shop/Order, validation: VALID_XML, schema_collection: Orders}
contracts:
  - name: //Shop/Ordering
    messages:
      - {type: //Shop/Order, sent_by: INITIATOR}
queues:
  - {name: Orders, partitions: 1}
services:
  - {name: //Shop/Customer, queue: Orders}
  - {name: //Shop/Shop, queue: Orders, contracts: [//Shop/Ordering]}
"""


def test_send_takes_a_valid_body_and_refuses_an_invalid_one_with_the_schemas_error(
    kafka_bootstrap, namespace, tmp_path
):
    (tmp_path / "schemas").mkdir()
    (tmp_path / "schemas" / "orders.xsd").write_text(ORDERS_XSD)
    (tmp_path / "shop.yaml").write_text(LOCAL)
    apply_paths(kafka_bootstrap, namespace, [tmp_path / "shop.yaml"])
    published = read_catalog(kafka_bootstrap, namespace)
    assert published.xml_schema_collections["Orders"].schemas == [ORDERS_XSD]  # the text, in the catalog topic
    assert published.message_types["//Shop/Order"].schema_collection == "Orders"
    with Broker(kafka_bootstrap, namespace) as broker:
        h = broker.begin_dialog("//Shop/Customer", "//Shop/Shop", "//Shop/Ordering")
        with pytest.raises(MessageValidationError) as refused:
            broker.send(h, "//Shop/Order", INVALID)
        assert refused.value.number == -9615 and SCHEMA_ERROR in str(refused.value), refused.value
        with pytest.raises(MessageValidationError), broker.transaction() as tx:  # in a transaction too
            tx.send(h, "//Shop/Order", INVALID)
        sent = broker.send(h, "//Shop/Order", VALID)
        got = []
        for _ in range(20):
            got += broker.receive("Orders", top=10, wait=1)
            if got:
                break
        assert [(m.message_id, m.body) for m in got] == [(sent, VALID)]
        assert broker.receive("Orders", top=10, wait=1) == []  # the refused ones were never written


def test_a_body_its_sender_did_not_validate_is_refused_on_arrival_with_error_9615(kafka_bootstrap, namespace, tmp_path):
    a, b = namespace + "a", namespace + "b"
    with two_namespaces(kafka_bootstrap, tmp_path, a, b) as (ba, bb, _services):
        # A sends the request unchecked; B checks it against its collection.
        (tmp_path / "a-update.yaml").write_text(f"message_types:\n  - {{name: {REQUEST}, validation: NONE}}\n")
        inline = orjson.dumps(ORDERS_XSD).decode()
        (tmp_path / "b-update.yaml").write_text(
            f"xml_schema_collections:\n  - {{name: Orders, schemas: [{inline}]}}\n"
            f"message_types:\n  - {{name: {REQUEST}, validation: VALID_XML, schema_collection: Orders}}\n"
        )
        apply_paths(kafka_bootstrap, a, [tmp_path / "a-update.yaml"])
        apply_paths(kafka_bootstrap, b, [tmp_path / "b-update.yaml"])
        ba.refresh_catalog()
        bb.refresh_catalog()

        good = ba.begin_dialog(CLIENT, SERVER, CONTRACT)
        ba.send(good, REQUEST, VALID)
        [arrived] = receive_all(bb, 1)
        assert (arrived.message_type_name, arrived.body) == (REQUEST, VALID)

        bad = ba.begin_dialog(CLIENT, SERVER, CONTRACT)
        ba.send(bad, REQUEST, INVALID)  # A's catalog does not validate it
        [error] = receive_all(ba, 1)
        assert error.message_type_name == ERROR and error.conversation_handle == bad
        root = SafeET.fromstring(error.body)
        assert root.tag == f"{{{SB_ERROR}}}Error" and root.findtext(f"{{{SB_ERROR}}}Code") == "-9615", error.body
        description = root.findtext(f"{{{SB_ERROR}}}Description") or ""
        assert description.startswith(
            f"A message of type '{REQUEST}' failed XML validation on the target service. schema collection 'Orders': "
        ), description
        assert SCHEMA_ERROR in description, description
        assert bb.receive("Q", top=10, wait=2) == []  # the target never got it
