"""What the messaging core announces to the apps built on it.

The core never imports ``workers``, ``archive`` or ``consoles``; they subscribe here instead
(in their ``AppConfig.ready()``). Receivers run in the request thread that sent the signal,
after the partition locks are released; a receiver that fails is logged and does not fail the
call (``send_robust``).
"""

from __future__ import annotations

from django.dispatch import Signal

#: Deliveries that are not first deliveries (``receive_count > 1``): the previous attempt ended
#: without an ack. kwargs: ``target`` (``"queue"`` or ``"topic/subscription"``), ``deliveries``
#: (list of :class:`queues.engine.partition.Delivery`, bodies loaded).
redelivered = Signal()

#: A consumer gave a message back on purpose (visibility set to 0) before its visibility ran
#: out. kwargs: ``target``, ``message_id`` (str), ``receive_count`` (the attempt given back).
given_back = Signal()
