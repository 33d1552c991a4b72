"""JSON in and out through orjson: the API's hot path parses a batch of 1,000 messages."""

from __future__ import annotations

import orjson
from django.conf import settings
from rest_framework.exceptions import ParseError
from rest_framework.parsers import BaseParser


class FastJSONParser(BaseParser):
    media_type = "application/json"

    def parse(self, stream, media_type=None, parser_context=None):
        request = (parser_context or {}).get("request")
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        length = int(request.META.get("CONTENT_LENGTH") or 0) if request is not None else 0
        # Imported here, not at the top: errors imports rest_framework.views, whose APIView
        # class body loads this module through DEFAULT_PARSER_CLASSES (an import cycle when
        # errors is imported first).
        from .errors import PayloadTooLarge

        if limit and length > limit:
            raise PayloadTooLarge(f"request body of {length} bytes is over the limit of {limit}")
        raw = stream.read() if stream is not None else b""
        if limit and len(raw) > limit:
            raise PayloadTooLarge(f"request body is over the limit of {limit} bytes")
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise ParseError(f"malformed JSON: {exc}") from None
