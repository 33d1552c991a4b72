"""The workers app listens to the messaging core (``queues.signals``) to keep the attempt log.

Connected in :meth:`workers.apps.WorkersConfig.ready`. The core sends these after its partition
locks are released, with ``send_robust``: a receiver that fails is logged there and does not
fail the dequeue or the visibility change.
"""

from __future__ import annotations

from workers import services


def on_redelivered(sender, *, target: str, deliveries, **kwargs) -> None:
    """Redeliveries: the attempts before them ended without an ack (abandoned unless reported)."""
    services.record_redeliveries(deliveries)


def on_given_back(sender, *, target: str, message_id: str, receive_count: int, **kwargs) -> None:
    """A consumer gave a message back (visibility 0): that attempt was given back, not abandoned."""
    services.record_given_back(message_id, receive_count)
