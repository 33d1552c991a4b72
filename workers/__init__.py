"""Queue clients: the SDK, handlers, the pre-process/process pipeline and its Celery step."""

from .handlers import handler

__all__ = ["handler"]
