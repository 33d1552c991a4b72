"""How the SQS API spells what identifies a message: its MessageId, what its receipt handle
carries, a FIFO message's SequenceNumber.

The service's message ID is a path, ``<queue>/<partition>/<block>/<index>`` (``queues.engine.ids``);
the REST API shows it so. SQS's MessageIds are UUIDs, and clients put them where a ``/`` is not
taken (a batch entry's ``Id``: letters, digits, ``-`` and ``_``, at most 80). So the SQS API
answers ``<block>-<partition>-<index>`` (``0000002a-5f0c9e1d2b3a4c5d-3-17``: at most 36
characters, like a UUID). The block's 64 random bits keep it unique across queues; the queue
makes it the service's ID again (:func:`service_id`). A receipt handle is opaque: it carries
the service's ID, queue included, so a handle of one queue is refused on another (one that
carries the SQS spelling is read too, with the queue of the call). A dead letter answers the MessageId it had in the queue it came from (``history.id``,
which only a node writes), as SQS keeps it.

A FIFO message's SequenceNumber is its position in its partition, so in its group: the block's
ordinal (increasing in a partition) and the index in the block, ``2**64 | ordinal << 20 | index``
(20 digits, as AWS's); the same at send and at every receive.
"""

from __future__ import annotations

import binascii

from queues import service

#: the bits of the index in a SequenceNumber (an index has at most 5 decimal digits).
_INDEX_BITS = 20
#: above the ordinal's 32 bits and the index's: 20 digits, as large as AWS's (never 0).
_BASE = 1 << 64


def sqs_message_id(message_id: str) -> str:
    """The SQS API's MessageId of the service's ``message_id`` (one not well formed as it is)."""
    mid = service.parse_message_id(message_id)
    if mid is None:
        return message_id
    return f"{mid.block}-{mid.partition}-{mid.index}"


def issued_sqs_id(message_id: str) -> str:
    """:func:`sqs_message_id` of an ID the service issued just now (an enqueue's answer, a
    delivery's ``id``): well formed, so cut rather than parsed again (a batch makes ten)."""
    parts = message_id.rsplit("/", 3)
    if len(parts) != 4:
        return sqs_message_id(message_id)
    return f"{parts[2]}-{parts[1]}-{parts[3]}"


def service_id(queue: str, message_id: str) -> service.MessageId | None:
    """The service's ID of SQS MessageId ``message_id`` in ``queue`` (or of the service's own
    spelling of it), or None if it is neither."""
    if "/" in message_id:
        return service.parse_message_id(message_id)
    block, _, rest = message_id.rpartition("-")  # (block-partition)-index
    block, _, partition = block.rpartition("-")
    if not block:
        return None
    return service.parse_message_id(f"{queue}/{partition}/{block}/{rest}")


def sequence_number(message_id: str) -> str:
    """The SequenceNumber of the service's ``message_id`` ("0" if it is not well formed)."""
    mid = service.parse_message_id(message_id)
    if mid is None:
        return "0"
    ordinal = int(mid.block.partition("-")[0], 16)
    return str(_BASE | ordinal << _INDEX_BITS | mid.index)


def parse_receipt_handle(handle: object, queue: str) -> tuple[service.MessageId, str] | None:
    """(the service's message ID, receipt) of a receipt handle of ``queue`` (``actions`` makes
    them: ``<message ID>\n<receipt>[\n<deadline>]``, base64), or None."""
    if not isinstance(handle, str) or not handle:
        return None
    try:
        # base64.urlsafe_b64decode's steps, called straight (a delete parses ten of these)
        text = binascii.a2b_base64(handle.encode().translate(_FROM_URLSAFE)).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return None
    message_id, _, receipt = text.partition("\n")
    receipt = receipt.partition("\n")[0]  # (what follows it: the deadline of a FIFO receipt)
    mid = service_id(queue, message_id)
    if mid is None or mid.queue != queue or not receipt:
        return None
    return mid, receipt


#: ``base64.urlsafe_b64decode``'s translation to the standard alphabet.
_FROM_URLSAFE = bytes.maketrans(b"-_", b"+/")
