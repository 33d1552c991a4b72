"""How the SQS API spells a message's identity (``sqs.ids``) and a move task's handle: a
MessageId without ``/`` that serves as a batch entry ID and turns back into the service's ID
with its queue, a receipt handle that carries it, a SequenceNumber that grows with the
message's position, SQS's task handle."""

from __future__ import annotations

import base64
import json
import re

from sqs import ids
from sqs.move_tasks import parse_task_handle, task_handle

SERVICE_ID = "orders/3/0000002a-5f0c9e1d2b3a4c5d/17"


def test_a_message_id_has_no_slash_and_turns_back_with_its_queue():
    sqs_id = ids.sqs_message_id(SERVICE_ID)
    assert sqs_id == "0000002a-5f0c9e1d2b3a4c5d-3-17"
    assert re.fullmatch(r"[A-Za-z0-9_-]{1,80}", sqs_id) and len(sqs_id) <= 36
    assert str(ids.service_id("orders", sqs_id)) == SERVICE_ID
    # the service's own spelling is read as it is; nonsense is none
    assert str(ids.service_id("orders", SERVICE_ID)) == SERVICE_ID
    for bad in ("", "x", "0000002a-5f0c9e1d2b3a4c5d-3", "zz-5f0c9e1d2b3a4c5d-3-17", "0000002a-5f0c9e1d2b3a4c5d-3-017"):
        assert ids.service_id("orders", bad) is None, bad
    # an ID the service just issued is cut, not parsed: the same spelling
    for issued in (SERVICE_ID, "a-b_c/0/00000000-0000000000000000/0", "q/15/ffffffff-5f0c9e1d2b3a4c5d/99999"):
        assert ids.issued_sqs_id(issued) == ids.sqs_message_id(issued), issued
    assert ids.issued_sqs_id("not-an-id") == "not-an-id"


def test_a_receipt_handle_is_of_its_queue_only():
    handle = base64.urlsafe_b64encode(f"{SERVICE_ID}\nr3ceipt\n1700000000000".encode()).decode()
    mid, receipt = ids.parse_receipt_handle(handle, "orders") or (None, None)
    assert (str(mid), receipt) == (SERVICE_ID, "r3ceipt")
    assert ids.parse_receipt_handle(handle, "other") is None  # another queue's handle
    # one carrying the SQS spelling is read with the queue of the call
    short = base64.urlsafe_b64encode(f"{ids.sqs_message_id(SERVICE_ID)}\nr3ceipt".encode()).decode()
    assert str((ids.parse_receipt_handle(short, "orders") or (None,))[0]) == SERVICE_ID
    for bad in ("", "!!", base64.urlsafe_b64encode(b"0000002a-5f0c9e1d2b3a4c5d-3-17\n").decode(), 7):
        assert ids.parse_receipt_handle(bad, "orders") is None, bad


def test_sequence_numbers_grow_with_the_position():
    positions = [
        "q/0/00000000-0000000000000001/0",
        "q/0/00000000-0000000000000001/99999",
        "q/0/00000001-ffffffffffffffff/0",
        "q/0/0000002a-0000000000000000/5",
    ]
    numbers = [int(ids.sequence_number(p)) for p in positions]
    assert numbers == sorted(numbers) and len(set(numbers)) == len(numbers)
    assert all(len(str(n)) == 20 for n in numbers)  # as large as AWS's


def test_task_handles_are_sqs_s():
    arn = "arn:aws:sqs:eu-west-1:000000000000:dlq"
    handle = task_handle(arn)
    task = json.loads(base64.b64decode(handle))
    assert set(task) == {"taskId", "sourceArn"} and task["sourceArn"] == arn
    assert parse_task_handle(handle) == task
    assert task_handle(arn) != handle
    for bad in ("", "bm90LWEtdGFzaw==", "%%%", base64.b64encode(b'{"taskId": 1}').decode()):
        assert parse_task_handle(bad) is None, bad
