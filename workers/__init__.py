"""Queue consumers on the client SDK (``mq_client``): handlers, the pre-process/process pipeline and
its Celery step."""

from workers.handlers import handler

__all__ = ["handler"]
