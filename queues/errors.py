"""What the messaging core raises to its callers when a partition cannot do what was asked.

Re-exported by ``queues.partition``, where callers have always found them; they live here so
the modules the partition manager is built from can raise them without importing it.
"""


class PartitionUnavailable(Exception):
    """The partition cannot serve now (lease lost, store down); the client may retry."""


class NotServedHere(PartitionUnavailable):
    """This node holds no (usable) partition for the call; another node may."""


class LeaseLost(Exception):
    """This node is no longer the owner (renewal failed, or the epoch moved on). Raised by the
    leases (``queues.leases``, where callers find it too) and by a partition's open."""


class ReceiptMismatch(Exception):
    """An ack or visibility change whose message is not in flight under that receipt."""

    def __init__(self, msg_id: str, reason: str):
        super().__init__(f"{msg_id}: {reason}")
        self.msg_id = msg_id
        self.reason = reason
