"""Bounds of the message calls, for every entrance: the service enforces them, the API's
checks and its OpenAPI schema say them, the archive's replay batches by them. (A queue's
settings have theirs in ``queues.public.LIMITS``.)"""

from __future__ import annotations

#: Most messages one call enqueues, dequeues or acknowledges.
MAX_BATCH = 1000
#: Longest long poll, seconds, as SQS.
MAX_WAIT = 20
