"""XML schema collections (CREATE XML SCHEMA COLLECTION, VALIDATION = VALID_XML WITH SCHEMA
COLLECTION) without a broker: the loader reads them inline and from XSD files beside the YAML and
refuses a missing one, an XSD that does not compile (with its line and reason) and a file outside
the catalog's directory; they travel in the catalog's records; a body is checked against every
schema of its collection at SEND, on arrival (-9615) and on RECEIVE, parsed defused; compiled
schemas are cached and bounded; and a property: documents built to a small schema validate, the
same with a required element removed do not."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path
from xml.sax.saxutils import escape

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kbroker.core.catalog import xml_schemas
from kbroker.core.catalog.catalog_records import catalog_record
from kbroker.core.catalog.loader import load_definitions
from kbroker.core.catalog.models import Catalog, MessageType, XmlSchemaCollection
from kbroker.core.dialogs.arrival import REFUSE, SAVE, SCHEMA_VALIDATION_FAILED, check_arrival
from kbroker.core.dialogs.envelope import Envelope
from kbroker.core.dialogs.validation import validate_body
from kbroker.core.rejected import Rejected
from kbroker.errors import CatalogError, DefinitionError, MessageValidationError
from tests.unit.test_arrival_checks import message
from tests.unit.test_statements import CLAIM, World

ORDERS = textwrap.dedent(
    """\
    <?xml version="1.0" encoding="UTF-8"?>
    <xsd:schema xmlns:xsd="http://www.w3.org/2001/XMLSchema" targetNamespace="urn:orders"
                xmlns="urn:orders" elementFormDefault="qualified">
      <xsd:element name="order">
        <xsd:complexType>
          <xsd:sequence>
            <xsd:element name="id" type="xsd:int"/>
            <xsd:element name="customer" type="xsd:string"/>
            <xsd:element name="item" maxOccurs="unbounded">
              <xsd:complexType>
                <xsd:attribute name="sku" type="xsd:string" use="required"/>
                <xsd:attribute name="qty" type="xsd:positiveInteger" use="required"/>
              </xsd:complexType>
            </xsd:element>
          </xsd:sequence>
        </xsd:complexType>
      </xsd:element>
    </xsd:schema>
    """
)
INVOICES = (
    '<xsd:schema xmlns:xsd="http://www.w3.org/2001/XMLSchema" targetNamespace="urn:invoices">'
    '<xsd:element name="invoice" type="xsd:decimal"/></xsd:schema>'
)
BAD_XSD = (
    '<xsd:schema xmlns:xsd="http://www.w3.org/2001/XMLSchema">\n\n  <xsd:element name="x" type="xsd:nosuch"/>\n'
    "</xsd:schema>\n"
)
ORDER = "//shop/Order"
GOOD = b'<order xmlns="urn:orders"><id>7</id><customer>Ann</customer><item sku="A-1" qty="2"/></order>'


def write(dir: Path, name: str, text: str) -> Path:
    path = dir / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def catalog_yaml(collection: str, message_type: str = "") -> str:
    mt = message_type or f"  - {{name: {ORDER}, validation: valid_xml, schema_collection: Orders}}"
    return f"xml_schema_collections:\n{collection}\nmessage_types:\n{mt}\n"


def refusal(paths: list[Path]) -> str:
    with pytest.raises(DefinitionError) as refused:
        load_definitions(paths, "unit")
    return str(refused.value)


# --- the loader -----------------------------------------------------------------------------------


def test_a_collection_from_a_file_beside_the_yaml_and_inline_with_two_target_namespaces(tmp_path: Path) -> None:
    write(tmp_path, "xsd/orders.xsd", ORDERS)
    inline = orjson.dumps(INVOICES).decode()
    f = write(tmp_path, "c.yaml", catalog_yaml(f"  - {{name: Orders, files: [xsd/orders.xsd], schemas: [{inline}]}}"))
    catalog = load_definitions([f], "unit")
    collection = catalog.xml_schema_collections["Orders"]
    assert collection.schemas == [INVOICES, ORDERS]  # inline first, then the files: the text, not the path
    mt = catalog.message_types[ORDER]
    assert (mt.validation, mt.schema_collection) == ("VALID_XML", "Orders")
    assert catalog.schema_collection_of(mt) is collection
    assert catalog.origins["XML schema collection Orders"] == str(f)


def test_a_message_type_naming_a_missing_collection_is_refused(tmp_path: Path) -> None:
    f = write(tmp_path, "c.yaml", catalog_yaml(f"  - {{name: Other, schemas: [{orjson.dumps(INVOICES).decode()}]}}"))
    assert refusal([f]) == f"{f}: message type {ORDER}: XML schema collection 'Orders' is not defined"


@pytest.mark.parametrize(
    "message_type, reason",
    [
        (f"  - {{name: {ORDER}, validation: VALID_XML}}", "validation VALID_XML names its schema_collection"),
        (
            f"  - {{name: {ORDER}, validation: WELL_FORMED_XML, schema_collection: Orders}}",
            "schema_collection is for validation VALID_XML, not WELL_FORMED_XML",
        ),
    ],
)
def test_valid_xml_and_its_collection_go_together(tmp_path: Path, message_type: str, reason: str) -> None:
    f = write(
        tmp_path,
        "c.yaml",
        catalog_yaml(f"  - {{name: Orders, schemas: [{orjson.dumps(INVOICES).decode()}]}}", message_type),
    )
    assert refusal([f]).endswith(f"message type {ORDER}: {reason}")


def test_an_xsd_that_does_not_compile_is_refused_with_its_line_and_reason(tmp_path: Path) -> None:
    write(tmp_path, "bad.xsd", BAD_XSD)
    write(tmp_path, "orders.xsd", ORDERS)
    f = write(tmp_path, "c.yaml", catalog_yaml("  - {name: Orders, files: [orders.xsd, bad.xsd]}"))
    assert refusal([f]) == (
        f"{f}: XML schema collection Orders: bad.xsd does not compile: line 3: unknown type 'xsd:nosuch'"
    )
    g = write(tmp_path, "d.yaml", catalog_yaml("  - {name: Orders, schemas: ['<xsd:schema']}"))
    assert "XML schema collection Orders: schema 1 does not compile: not well-formed XML" in refusal([g])


@pytest.mark.parametrize("name", ["../outside.xsd", "sub/../../outside.xsd", "ABSOLUTE", "link.xsd"])
def test_a_file_outside_the_catalogs_directory_is_refused_and_says_why(tmp_path: Path, name: str) -> None:
    outside = write(tmp_path, "outside.xsd", ORDERS)
    home = tmp_path / "catalog"
    home.mkdir()
    os.symlink(outside, home / "link.xsd")
    name = str(outside) if name == "ABSOLUTE" else name
    f = write(home, "c.yaml", catalog_yaml(f"  - {{name: Orders, files: ['{name}']}}"))
    reason = refusal([f])
    assert reason.startswith(f"{f}: XML schema collection Orders: files: {name!r} ")
    assert "absolute path" in reason if name == str(outside) else f"leads outside {home.resolve()}" in reason
    assert "named relative to its YAML file and must be in its directory or below" in reason


@pytest.mark.parametrize(
    "collection, reason",
    [
        ("  - {name: Orders, files: [nope.xsd]}", "files: 'nope.xsd': no such file"),
        ("  - {name: Orders}", "holds no schema: give schemas or files"),
        ("  - {name: Orders, files: orders.xsd}", "schemas and files must be lists"),
    ],
)
def test_other_bad_collections(tmp_path: Path, collection: str, reason: str) -> None:
    f = write(tmp_path, "c.yaml", catalog_yaml(collection))
    assert f"XML schema collection Orders: {reason}" in refusal([f])


# --- the catalog topic ----------------------------------------------------------------------------


def test_the_collections_text_travels_in_the_catalogs_records(tmp_path: Path) -> None:
    write(tmp_path, "orders.xsd", ORDERS)
    catalog = load_definitions(
        [write(tmp_path, "c.yaml", catalog_yaml("  - {name: Orders, files: [orders.xsd]}"))], "u"
    )
    value = orjson.dumps(catalog.xml_schema_collections["Orders"].model_dump(mode="json"))
    assert catalog_record(b"xml_schema_collection/Orders", value) == (
        "xml_schema_collections",
        "Orders",
        XmlSchemaCollection(name="Orders", schemas=[ORDERS]),
    )
    back = Catalog.from_json(catalog.to_json())
    assert back.xml_schema_collections == catalog.xml_schema_collections
    assert back.message_types[ORDER] == catalog.message_types[ORDER]
    # A message type of another validation is written as before (a kbroker before this one reads it).
    assert MessageType(name="M").model_dump() == {"name": "M", "validation": "NONE"}


@pytest.mark.parametrize(
    "value",
    [
        b"\x00 not json",
        orjson.dumps({"name": "Orders"}),  # no schemas
        orjson.dumps({"name": "Orders", "schemas": []}),
        orjson.dumps({"name": "Other", "schemas": [ORDERS]}),  # named unlike its key
        orjson.dumps({"name": "Orders", "schemas": [ORDERS], "forged": True}),
        orjson.dumps({"name": "Orders", "schemas": ["x" * 100_000, 7]}),
    ],
)
def test_a_collection_record_another_client_wrote_badly_is_rejected(value: bytes) -> None:
    with pytest.raises(Rejected):
        catalog_record(b"xml_schema_collection/Orders", value)


# --- validation -------------------------------------------------------------------------------------

COLLECTION = XmlSchemaCollection(name="Orders", schemas=[ORDERS, INVOICES])


def failure(body: bytes, collection: XmlSchemaCollection | None = COLLECTION) -> MessageValidationError:
    with pytest.raises(MessageValidationError) as refused:
        validate_body(ORDER, "VALID_XML", body, collection)
    return refused.value


def test_a_valid_body_of_either_namespace_passes_and_an_empty_one_too() -> None:
    validate_body(ORDER, "VALID_XML", GOOD, COLLECTION)
    validate_body(ORDER, "VALID_XML", b'<i:invoice xmlns:i="urn:invoices">12.50</i:invoice>', COLLECTION)
    validate_body(ORDER, "VALID_XML", b"", COLLECTION)  # as for WELL_FORMED_XML


def test_an_invalid_body_is_refused_with_the_schemas_message_and_line() -> None:
    exc = failure(b'<order xmlns="urn:orders">\n<id>seven</id><customer>Ann</customer><item sku="A" qty="1"/></order>')
    assert exc.number == -9615 and exc.validation == "VALID_XML"
    assert exc.reason.startswith("schema collection 'Orders': line 2: ") and "(at /order/id)" in exc.reason
    assert str(exc).startswith(f"body of {ORDER!r} fails VALID_XML validation: error -9615: ")
    missing = failure(b'<order xmlns="urn:orders"><id>1</id><item sku="A" qty="1"/></order>').reason
    assert "Tag '{urn:orders}customer' expected" in missing, missing
    assert "'{urn:other}order' is not an element of the schema" in failure(b'<order xmlns="urn:other"/>').reason
    assert "'invoice' is not an element" in failure(b"<invoice>1</invoice>").reason  # no namespace: not declared
    assert "not well-formed" in failure(b"<order").reason or "unclosed" in failure(b"<order").reason


@pytest.mark.parametrize(
    "body",
    [
        b'<!DOCTYPE order [<!ENTITY e SYSTEM "file:///etc/passwd">]><order xmlns="urn:orders">&e;</order>',
        b'<!DOCTYPE order [<!ENTITY e "x">]><order xmlns="urn:orders"><id>1</id><customer>&e;</customer></order>',
    ],
)
def test_a_body_with_an_entity_is_refused(body: bytes) -> None:
    assert "EntitiesForbidden" in failure(body).reason


def test_a_schema_location_hint_loads_nothing() -> None:
    body = (
        b'<order xmlns="urn:orders" xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance" '
        b'xsi:schemaLocation="urn:orders http://127.0.0.1:9/orders.xsd"><id>1</id></order>'
    )
    assert "Tag '{urn:orders}customer' expected" in failure(body).reason


def test_a_collection_that_does_not_compile_refuses_every_body_and_none_refuses_too() -> None:
    bad = XmlSchemaCollection(name="Bad", schemas=[BAD_XSD])
    assert "the schema collection does not compile: schema 1: line 3: unknown type" in failure(b"<x/>", bad).reason
    assert failure(GOOD, None).reason == "no schema collection to validate against"


def test_compiled_schemas_are_cached_by_text_and_bounded() -> None:
    first = xml_schemas.compiled([ORDERS, INVOICES])
    assert xml_schemas.compiled(list(COLLECTION.schemas)) is first  # another catalog's equal text
    for n in range(xml_schemas.CACHE_SIZE + 5):
        xml_schemas.compiled([f'<xsd:schema xmlns:xsd="http://www.w3.org/2001/XMLSchema" targetNamespace="urn:{n}"/>'])
    assert xml_schemas.cache_size() == xml_schemas.CACHE_SIZE
    assert xml_schemas.compiled([ORDERS, INVOICES]) is not first  # evicted, compiled again


# --- SEND, arrival and RECEIVE ----------------------------------------------------------------------


def world_with_claim_validated() -> World:
    world = World()
    c = world.catalog
    world.catalog = c.model_copy(
        update={
            "message_types": {
                **c.message_types,
                CLAIM: MessageType(name=CLAIM, validation="VALID_XML", schema_collection="Orders"),
            },
            "xml_schema_collections": {"Orders": COLLECTION},
        }
    )
    return world


def test_send_refuses_an_invalid_body_and_takes_a_valid_one() -> None:
    world = world_with_claim_validated()
    ep = world.dialog()
    record, _, _ = world.statements.message_record(ep, CLAIM, GOOD)
    assert record[2] == GOOD
    with pytest.raises(MessageValidationError) as refused:
        world.statements.message_record(ep, CLAIM, b'<order xmlns="urn:orders"><id>1</id></order>')
    assert refused.value.number == -9615 and "customer" in refused.value.reason


def test_send_with_a_collection_the_catalog_lacks_is_a_catalog_error() -> None:
    world = world_with_claim_validated()
    world.catalog = world.catalog.model_copy(update={"xml_schema_collections": {}})
    with pytest.raises(CatalogError, match="unknown XML schema collection 'Orders'"):
        world.statements.message_record(world.dialog(), CLAIM, GOOD)


def test_on_arrival_an_invalid_body_is_refused_with_9615() -> None:
    world = world_with_claim_validated()
    catalog = world.catalog
    contract = next(iter(catalog.services["//Adventure-Works.com/Expenses"].contracts))
    env = Envelope(
        "m", "c", "g", 0, CLAIM, contract, "//Adventure-Works.com/Employees", "//Adventure-Works.com/Expenses", "TARGET"
    )
    assert check_arrival(catalog, env, GOOD).action == SAVE
    verdict = check_arrival(catalog, env, b'<order xmlns="urn:orders"><id>x</id></order>')
    assert (verdict.action, verdict.code) == (REFUSE, SCHEMA_VALIDATION_FAILED) == (REFUSE, -9615)
    assert verdict.reason.startswith(f"A message of type '{CLAIM}' failed XML validation on the target service. ")
    assert "schema collection 'Orders': line 1: " in verdict.reason and "(at /order/id)" in verdict.reason
    lacking = catalog.model_copy(update={"xml_schema_collections": {}})
    verdict = check_arrival(lacking, env, GOOD)
    assert (verdict.code, verdict.reason.endswith("unknown XML schema collection 'Orders'")) == (-9615, True)


# --- the property -------------------------------------------------------------------------------

words = st.text(st.characters(categories=("L", "N", "P", "Zs")), max_size=12)
orders = st.fixed_dictionaries(
    {
        "id": st.integers(-(2**31), 2**31 - 1),
        "customer": words,
        "items": st.lists(st.tuples(words, st.integers(1, 10**6)), min_size=1, max_size=4),
    }
)


def order_xml(order: dict, leave_out: str | None = None) -> bytes:
    parts = []
    if leave_out != "id":
        parts.append(f"<id>{order['id']}</id>")
    if leave_out != "customer":
        parts.append(f"<customer>{escape(order['customer'])}</customer>")
    if leave_out != "item":
        parts += [f'<item sku="{escape(sku, {chr(34): "&quot;"})}" qty="{qty}"/>' for sku, qty in order["items"]]
    return f'<order xmlns="urn:orders">{"".join(parts)}</order>'.encode()


@settings(max_examples=60, deadline=None)
@given(orders, st.sampled_from(["id", "customer", "item"]))
def test_documents_built_to_the_schema_validate_and_without_a_required_element_do_not(order: dict, gone: str) -> None:
    validate_body(ORDER, "VALID_XML", order_xml(order), COLLECTION)
    exc = failure(order_xml(order, leave_out=gone))
    assert f"{{urn:orders}}{gone}" in exc.reason, exc.reason


def test_receive_sets_aside_a_record_its_collection_refuses() -> None:
    """A record another Kafka client wrote onto the queue never passed SEND: RECEIVE checks it."""
    world = world_with_claim_validated()
    assert world.statements.refused_record(message("c1", 0, body=GOOD)) is None
    refused = world.statements.refused_record(message("c1", 0, body=b'<order xmlns="urn:orders"/>'))
    assert refused is not None
    _, reason = refused
    assert reason.startswith("refused on arrival: body of") and "error -9615" in reason and "{urn:orders}id" in reason
