"""The workers app listens to the messaging core (``queues.signals``) to keep the attempt log.

Connected in :meth:`workers.apps.WorkersConfig.ready`. The core sends these after its partition
locks are released, with ``send_robust``: a receiver that fails is logged there and does not
fail the dequeue or the visibility change.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from workers import services

if TYPE_CHECKING:
    from queues.service.types import Delivery


def on_redelivered(sender: object, *, target: str, deliveries: Iterable[Delivery], **kwargs: object) -> None:
    """Redeliveries: the attempts before them ended without an ack (abandoned unless reported)."""
    services.record_redeliveries(deliveries)


def on_given_back(sender: object, *, target: str, message_id: str, receive_count: int, **kwargs: object) -> None:
    """A consumer gave a message back (visibility 0): that attempt was given back, not abandoned."""
    services.record_given_back(message_id, receive_count)
