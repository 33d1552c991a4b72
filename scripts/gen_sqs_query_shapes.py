"""Write ``sqs/query_shapes.py``: the SQS shapes the query-protocol codec (``sqs/query.py``) needs.

    scripts/in-venv.sh python scripts/gen_sqs_query_shapes.py [--legacy PATH/service-2.json]

Run at development time, after a botocore upgrade. botocore is a development dependency only, so
the codec reads the static description this writes instead of botocore's model at runtime;
``tests/unit/test_sqs_query.py`` checks the committed file against botocore's model.

botocore's SQS model is JSON-protocol only since late 2023 (botocore 1.32): it keeps the shapes
(members, types, which lists are flattened) but dropped what only the query protocol needs, the
wire names (``locationName``: ``Attribute.1.Name``, ``SendMessageBatchRequestEntry.1.Id``) and the
query error codes (``AWS.SimpleQueueService.NonExistentQueue`` for ``QueueDoesNotExist``).
``QUERY_TRAITS`` below restores them, copied from the last query model botocore shipped (1.31.x,
``botocore/data/sqs/2012-11-05/service-2.json``); ``--legacy PATH`` checks them against such a
file. Shapes added after the switch get names by the same rule (a list's element is named as
its singular, ``MessageSystemAttributeName``) and their codes from SQS's awsQueryError traits.
"""

from __future__ import annotations

import argparse
import copy
import json
import pprint
import subprocess
import sys
from pathlib import Path
from typing import Any

XML_NAMESPACE = "http://queue.amazonaws.com/doc/2012-11-05/"

#: Query wire names and error codes the JSON model no longer carries (see the module docstring).
QUERY_TRAITS: dict[str, Any] = {
    # Shape-level locationName: the name every member of this shape is sent under.
    "shape_names": {"QueueAttributeMap": "Attribute", "MessageSystemAttributeMap": "Attribute", "TagMap": "Tag"},
    # Member-level locationName, by (structure, member).
    "member_names": {
        ("CreateQueueRequest", "Attributes"): "Attribute",
        ("CreateQueueRequest", "tags"): "Tag",
        ("GetQueueAttributesResult", "Attributes"): "Attribute",
        ("ListQueueTagsResult", "Tags"): "Tag",
        ("Message", "Attributes"): "Attribute",
        ("Message", "MessageAttributes"): "MessageAttribute",
        ("MessageAttributeValue", "StringListValues"): "StringListValue",
        ("MessageAttributeValue", "BinaryListValues"): "BinaryListValue",
        ("MessageSystemAttributeValue", "StringListValues"): "StringListValue",
        ("MessageSystemAttributeValue", "BinaryListValues"): "BinaryListValue",
        ("SendMessageBatchRequestEntry", "MessageAttributes"): "MessageAttribute",
        ("SendMessageBatchRequestEntry", "MessageSystemAttributes"): "MessageSystemAttribute",
        ("SendMessageRequest", "MessageAttributes"): "MessageAttribute",
        ("SendMessageRequest", "MessageSystemAttributes"): "MessageSystemAttribute",
        ("SetQueueAttributesRequest", "Attributes"): "Attribute",
    },
    # The name of each element of a list.
    "list_member_names": {
        "AWSAccountIdList": "AWSAccountId",
        "ActionNameList": "ActionName",
        "AttributeNameList": "AttributeName",
        "BatchResultErrorEntryList": "BatchResultErrorEntry",
        "BinaryList": "BinaryListValue",
        "ChangeMessageVisibilityBatchRequestEntryList": "ChangeMessageVisibilityBatchRequestEntry",
        "ChangeMessageVisibilityBatchResultEntryList": "ChangeMessageVisibilityBatchResultEntry",
        "DeleteMessageBatchRequestEntryList": "DeleteMessageBatchRequestEntry",
        "DeleteMessageBatchResultEntryList": "DeleteMessageBatchResultEntry",
        "ListMessageMoveTasksResultEntryList": "ListMessageMoveTasksResultEntry",
        "MessageAttributeNameList": "MessageAttributeName",
        "MessageList": "Message",
        "MessageSystemAttributeList": "MessageSystemAttributeName",  # added after the switch
        "QueueUrlList": "QueueUrl",
        "SendMessageBatchRequestEntryList": "SendMessageBatchRequestEntry",
        "SendMessageBatchResultEntryList": "SendMessageBatchResultEntry",
        "StringList": "StringListValue",
        "TagKeyList": "TagKey",
    },
    # A map entry's key and value names: Name/Value everywhere but tags.
    "map_entry_names": {
        "MessageBodyAttributeMap": ("Name", "Value"),
        "MessageBodySystemAttributeMap": ("Name", "Value"),
        "MessageSystemAttributeMap": ("Name", "Value"),
        "QueueAttributeMap": ("Name", "Value"),
        "TagMap": ("Key", "Value"),
    },
    # Query error code by error shape; a shape not listed keeps its own name as its code.
    "error_codes": {
        "BatchEntryIdsNotDistinct": "AWS.SimpleQueueService.BatchEntryIdsNotDistinct",
        "BatchRequestTooLong": "AWS.SimpleQueueService.BatchRequestTooLong",
        "EmptyBatchRequest": "AWS.SimpleQueueService.EmptyBatchRequest",
        "InvalidBatchEntryId": "AWS.SimpleQueueService.InvalidBatchEntryId",
        "MessageNotInflight": "AWS.SimpleQueueService.MessageNotInflight",
        "PurgeQueueInProgress": "AWS.SimpleQueueService.PurgeQueueInProgress",
        "QueueDeletedRecently": "AWS.SimpleQueueService.QueueDeletedRecently",
        "QueueDoesNotExist": "AWS.SimpleQueueService.NonExistentQueue",
        "QueueNameExists": "QueueAlreadyExists",
        "TooManyEntriesInBatchRequest": "AWS.SimpleQueueService.TooManyEntriesInBatchRequest",
        "UnsupportedOperation": "AWS.SimpleQueueService.UnsupportedOperation",
        # Added after the switch (SQS's awsQueryError traits).
        "KmsAccessDenied": "KMS.AccessDeniedException",
        "KmsDisabled": "KMS.DisabledException",
        "KmsInvalidKeyUsage": "KMS.InvalidKeyUsageException",
        "KmsInvalidState": "KMS.InvalidStateException",
        "KmsNotFound": "KMS.NotFoundException",
        "KmsOptInRequired": "KMS.OptInRequired",
        "KmsThrottled": "KMS.ThrottlingException",
    },
}


def query_model(raw: dict[str, Any]) -> dict[str, Any]:
    """botocore's raw SQS model (JSON protocol) made a query-protocol model: the same shapes with
    ``QUERY_TRAITS`` put back, so botocore's own query serializer and parser can speak it."""
    model = copy.deepcopy(raw)
    model["metadata"].update(protocol="query", protocols=["query"], xmlNamespace=XML_NAMESPACE)
    for key in ("jsonVersion", "targetPrefix", "awsQueryCompatible"):
        model["metadata"].pop(key, None)
    for operation in model["operations"].values():
        if "output" in operation:
            operation["output"]["resultWrapper"] = operation["output"]["shape"]
    shapes = model["shapes"]
    for name, location in QUERY_TRAITS["shape_names"].items():
        shapes[name]["locationName"] = location
    for (structure, member), location in QUERY_TRAITS["member_names"].items():
        shapes[structure]["members"][member]["locationName"] = location
    for name, location in QUERY_TRAITS["list_member_names"].items():
        shapes[name]["member"]["locationName"] = location
    for name, (key, value) in QUERY_TRAITS["map_entry_names"].items():
        shapes[name]["key"]["locationName"] = key
        shapes[name]["value"]["locationName"] = value
    for name, shape in shapes.items():
        if shape.get("exception"):
            shape["error"] = {"code": QUERY_TRAITS["error_codes"].get(name, name), "senderFault": True}
    return model


def _member(shapes: dict[str, Any], ref: dict[str, Any], member: str) -> tuple[str, str, bool]:
    """(target shape, wire name, flattened) of a structure member, resolved as botocore does: the
    member reference's traits over the target shape's."""
    target = shapes[ref["shape"]]
    name = ref.get("locationName") or target.get("locationName") or member
    flattened = bool(ref.get("flattened") or target.get("flattened"))
    return ref["shape"], name, flattened


def describe(model: dict[str, Any]) -> dict[str, Any]:
    """The compact description ``sqs/query_shapes.py`` holds, from a query-protocol model."""
    shapes = model["shapes"]
    described: dict[str, Any] = {}

    def visit(name: str) -> None:
        if name in described:
            return
        shape = shapes[name]
        kind = shape["type"]
        if kind == "structure":
            members = {m: _member(shapes, ref, m) for m, ref in shape["members"].items()}
            described[name] = ("structure", members)
            for target, _, _ in members.values():
                visit(target)
        elif kind == "list":
            described[name] = ("list", shape["member"]["shape"], shape["member"].get("locationName"))
            visit(shape["member"]["shape"])
        elif kind == "map":
            key, value = shape["key"], shape["value"]
            described[name] = (
                "map",
                key["shape"],
                key.get("locationName", "key"),
                value["shape"],
                value.get("locationName", "value"),
            )
            visit(key["shape"])
            visit(value["shape"])
        else:
            described[name] = (kind,)

    operations = {}
    for op_name, op in sorted(model["operations"].items()):
        request = op["input"]["shape"] if "input" in op else None
        result = op["output"]["shape"] if "output" in op else None
        operations[op_name] = (request, result)
        for shape_name in (request, result):
            if shape_name:
                visit(shape_name)
    errors = {name: shape["error"]["code"] for name, shape in sorted(shapes.items()) if shape.get("exception")}
    return {
        "XML_NAMESPACE": XML_NAMESPACE,
        "OPERATIONS": operations,
        "SHAPES": dict(sorted(described.items())),
        "ERROR_CODES": errors,
    }


def botocore_raw_model() -> dict[str, Any]:
    import botocore.session

    return botocore.session.get_session().get_component("data_loader").load_service_model("sqs", "service-2")


def check_legacy(model: dict[str, Any], legacy: dict[str, Any]) -> list[str]:
    """Where ``model``'s query traits differ from a legacy query model, for the shapes in both."""
    differences = []
    for name, old in legacy["shapes"].items():
        new = model["shapes"].get(name)
        if new is None:
            continue
        pairs = [(name, old.get("locationName"), new.get("locationName"))]
        if old["type"] == "structure":
            for member, ref in old["members"].items():
                if member in new["members"]:
                    pairs.append(
                        (f"{name}.{member}", ref.get("locationName"), new["members"][member].get("locationName"))
                    )
        elif old["type"] == "list":
            pairs.append((f"{name}[]", old["member"].get("locationName"), new["member"].get("locationName")))
        elif old["type"] == "map":
            for part in ("key", "value"):
                pairs.append((f"{name}.{part}", old[part].get("locationName"), new[part].get("locationName")))
        if old.get("exception"):
            pairs.append((f"{name} code", old.get("error", {}).get("code", name), new["error"]["code"]))
        differences += [f"{where}: legacy {a!r}, ours {b!r}" for where, a, b in pairs if a != b]
    return differences


def render(description: dict[str, Any]) -> str:
    lines = [
        '"""The SQS shapes the query-protocol codec (``sqs/query.py``) reads: generated by',
        "``scripts/gen_sqs_query_shapes.py`` from botocore's SQS model; do not edit by hand.",
        "",
        "OPERATIONS: action -> (request shape, result shape or None).",
        'SHAPES: name -> ("structure", {member: (shape, wire name, flattened)})',
        '    | ("list", element shape, element wire name or None)',
        '    | ("map", key shape, key wire name, value shape, value wire name) | (scalar type,).',
        "ERROR_CODES: the JSON protocol's error code (the shape name) -> the query protocol's.",
        '"""',
        "",
        "from typing import Any",
        "",
    ]
    for name, value in description.items():
        annotation = "str" if isinstance(value, str) else "dict[str, Any]"
        lines.append(f"{name}: {annotation} = {pprint.pformat(value, width=110, sort_dicts=False)}")
        lines.append("")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--legacy", type=Path, help="a botocore <= 1.31 sqs service-2.json to check QUERY_TRAITS")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent.parent / "sqs" / "query_shapes.py")
    args = parser.parse_args()
    model = query_model(botocore_raw_model())
    if args.legacy:
        differences = check_legacy(model, json.loads(args.legacy.read_text()))
        for line in differences:
            print(line, file=sys.stderr)
        if differences:
            return 1
        print("QUERY_TRAITS agree with", args.legacy, file=sys.stderr)
    args.out.write_text(render(describe(model)))
    subprocess.run([sys.executable, "-m", "ruff", "format", "--quiet", str(args.out)], check=False)
    print("wrote", args.out, file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
