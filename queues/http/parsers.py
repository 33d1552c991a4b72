"""JSON in and out through orjson: the API's hot path parses a batch of 1,000 messages."""

from __future__ import annotations

from collections.abc import Mapping
from typing import IO, Any

import orjson
from django.conf import settings
from rest_framework.exceptions import ParseError
from rest_framework.parsers import BaseParser

from queues.errors import PayloadTooLarge


class FastJSONParser(BaseParser):
    media_type = "application/json"

    def parse(
        self, stream: IO[Any] | None, media_type: str | None = None, parser_context: Mapping[str, Any] | None = None
    ) -> Any:  # a JSON body before validation: any JSON value
        context = parser_context or {}
        request, view = context.get("request"), context.get("view")
        limit = settings.API_MAX_REQUEST_BYTES
        if request is not None and view is not None and hasattr(view, "body_limit"):
            limit = view.body_limit(request)  # a message call: the queue's own limits
        length = int(request.META.get("CONTENT_LENGTH") or 0) if request is not None else 0
        if length > limit:
            raise PayloadTooLarge(f"request body of {length} bytes is over this call's limit of {limit} bytes")
        # Never more than the limit and one byte, whatever the length said (or did not say).
        raw = stream.read(limit + 1) if stream is not None else b""
        if len(raw) > limit:
            raise PayloadTooLarge(f"request body is over this call's limit of {limit} bytes")
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise ParseError(f"malformed JSON: {exc}") from None
