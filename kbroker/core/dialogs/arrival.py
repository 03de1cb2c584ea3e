"""What the dispatcher does with a message that arrived from another namespace (pure logic):
save it, keep it waiting at the sender, or refuse it with Service Broker's Error.

Service Broker checks a remote message where it arrives (reference items 4 and 23): a target
service it does not host (yet) is not an error, the sender keeps the message and retries, with the
reason in sys.transmission_queue.transmission_status; a contract, message type or body the target
does not accept is answered with an Error message that ends the dialog, with these codes.
"""

from __future__ import annotations

from dataclasses import dataclass

from kbroker.core.catalog.models import SYSTEM_TYPES, Catalog
from kbroker.core.catalog.objects import SECURITY_LEVELS
from kbroker.core.dialogs.envelope import Envelope
from kbroker.core.dialogs.validation import validate_body
from kbroker.errors import CatalogError, MessageValidationError

SAVE, WAIT, REFUSE = "save", "wait", "refuse"
SENT_BY_TARGET_ONLY = -8457  # sent by the initiator, but the contract says SENT BY TARGET
SENT_BY_INITIATOR_ONLY = -8437
NOT_IN_CONTRACT = -8498
CONTRACT_NOT_SUPPORTED = -8408
CONTRACT_NOT_FOUND = -8425
MESSAGE_TYPE_NOT_FOUND = -8428
VALIDATION_FAILED = -8430
XML_VALIDATION_FAILED = -9616
SCHEMA_VALIDATION_FAILED = -9615  # VALID_XML WITH SCHEMA COLLECTION: "failed XML validation on the target service"
TOO_LARGE = -9602  # kbroker's own (Service Broker queues have no size limit)
NO_PERMISSION = -8494  # the sending namespace was not granted SEND on the service (docs/sources.md, item 148)


def too_large_description(size: int, queue: str, limit: int) -> str:
    """The Error description of TOO_LARGE: a body over its queue's max_message_bytes."""
    return f"The message has {size} bytes; queue '{queue}' takes at most {limit}."


def too_large_reason(size: int, queue: str, limit: int) -> str:
    """Why a body over its queue's limit is refused, with the code a routed one is answered with
    (a RECEIVE's check of a record another client wrote: statements.refused_record)."""
    return f"error {TOO_LARGE}: {too_large_description(size, queue, limit)}"


@dataclass(frozen=True)
class Verdict:
    action: str  # SAVE, WAIT or REFUSE
    code: int = 0  # REFUSE: the Error's code
    reason: str = ""  # WAIT: the transmission status; REFUSE: the Error's description


def check_arrival(catalog: Catalog, env: Envelope, body: bytes, security: str = "none") -> Verdict:
    """The verdict on a message for `env.to_service_name` in the namespace of `catalog`;
    `security`: the dialog security it came with (SECURITY_LEVELS)."""
    service = catalog.services.get(env.to_service_name)
    if service is None:
        return Verdict(
            WAIT,
            reason=f"The target service name '{env.to_service_name}' could not be found "
            f"in namespace {catalog.namespace}.",
        )
    queue = catalog.queues.get(service.queue)
    if queue is None:
        return Verdict(WAIT, reason=f"The queue of service '{env.to_service_name}' is not defined.")
    if queue.status == "OFF":
        return Verdict(WAIT, reason=f"The target queue '{queue.name}' is disabled.")
    kind, contract_name = env.message_type_name, env.service_contract_name
    if kind in SYSTEM_TYPES:  # ends the dialog: taken from whoever holds it, even after a revoke
        return Verdict(SAVE)
    if service.remote_senders is not None and env.from_broker not in service.remote_senders:
        return Verdict(
            REFUSE, NO_PERMISSION, f"You do not have permission to access the service '{env.to_service_name}'."
        )
    if env.to_side == "TARGET" and SECURITY_LEVELS.index(security) < SECURITY_LEVELS.index(service.remote_security):
        return Verdict(
            REFUSE,
            NO_PERMISSION,
            f"You do not have permission to access the service '{env.to_service_name}': it takes dialogs "
            f"with {service.remote_security} dialog security, and this one has {security}.",
        )
    contract = catalog.contracts.get(contract_name)
    if contract is None:
        return Verdict(REFUSE, CONTRACT_NOT_FOUND, f"The service contract '{contract_name}' is not found.")
    if env.to_side == "TARGET" and contract_name not in service.contracts:
        return Verdict(
            REFUSE,
            CONTRACT_NOT_SUPPORTED,
            f"Target service '{env.to_service_name}' does not support contract '{contract_name}'.",
        )
    mt = catalog.message_types.get(kind)
    if mt is None:
        return Verdict(REFUSE, MESSAGE_TYPE_NOT_FOUND, f"The message type '{kind}' is not found.")
    listed = [m for m in contract.messages if m.type == kind]
    if not listed:
        return Verdict(
            REFUSE, NOT_IN_CONTRACT, f"The message type '{kind}' is not part of the service contract '{contract_name}'."
        )
    sender = "INITIATOR" if env.to_side == "TARGET" else "TARGET"
    if listed[0].sent_by not in (sender, "ANY"):
        code = SENT_BY_TARGET_ONLY if sender == "INITIATOR" else SENT_BY_INITIATOR_ONLY
        return Verdict(
            REFUSE,
            code,
            f"The message type '{kind}' was sent by the {sender.lower()}, but the "
            f"contract '{contract_name}' says SENT BY {listed[0].sent_by}.",
        )
    if len(body) > queue.max_message_bytes:
        return Verdict(REFUSE, TOO_LARGE, too_large_description(len(body), queue.name, queue.max_message_bytes))
    try:
        validate_body(kind, mt.validation, body, catalog.schema_collection_of(mt))
    except CatalogError as exc:  # a collection no record holds (the loader refuses such a file)
        return Verdict(REFUSE, SCHEMA_VALIDATION_FAILED, _schema_failure(kind, str(exc)))
    except MessageValidationError as exc:
        if mt.validation == "VALID_XML":
            return Verdict(REFUSE, SCHEMA_VALIDATION_FAILED, _schema_failure(kind, exc.reason))
        code = XML_VALIDATION_FAILED if mt.validation == "WELL_FORMED_XML" else VALIDATION_FAILED
        return Verdict(REFUSE, code, str(exc))
    return Verdict(SAVE)


def _schema_failure(kind: str, reason: str) -> str:
    """The Error description of SCHEMA_VALIDATION_FAILED, in Service Broker's words."""
    return f"A message of type '{kind}' failed XML validation on the target service. {reason}"
