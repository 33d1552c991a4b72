"""A topic's subscription consumed by the very handler of the queue tests: a worker takes
``"topic/subscription"`` wherever it takes a queue name (added to ``WORKER_HANDLERS``)."""

from tests.integration.handlers_for_tests import fetch, process
from workers import handler

SUBSCRIPTION = "news/mail"
handler(SUBSCRIPTION, preprocess=fetch)(process)
