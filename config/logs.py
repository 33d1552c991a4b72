"""One log record, one line: what a caller wrote reaches the logs escaped.

A node or a worker logs values that came from outside: a header, a message's attribute, a
Celery task's headers, another node's answer, and OpenTelemetry's own warnings print what they
could not parse. Written raw, a line feed in one of them starts a line that reads as a record
of its own, and an ANSI escape sequence rewrites the operator's terminal. :class:`EscapeControls`
is a filter on the handlers (Django's ``LOGGING``, and the Celery worker's handlers, which
``config.celery`` gives it): it writes each record's message, traceback and stack with every
control character escaped (``\\n``, ``\\x1b``, ``\\u2028``, ...). A traceback keeps its own
line breaks, every other control character escaped, and its lines after the first indented:
none of them starts where a record does, not even a line of an exception's own message.
"""

from __future__ import annotations

import logging
import re

#: C0 and C1 controls, DEL, the Unicode line and paragraph separators, and the bidirectional
#: overrides (which reorder what a terminal shows).
_CONTROLS = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
#: the attribute that marks a record escaped (a record passes each handler's filter)
_DONE = "mq_escaped"
#: formats a traceback as the logging module's own formatter does
_FORMATTER = logging.Formatter()


def _escaped(match: re.Match[str]) -> str:
    char = match.group()
    named = _NAMED.get(char)
    if named is not None:
        return named
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def escape(text: str) -> str:
    """``text`` with every control character written as an escape (one line, nothing that a
    terminal acts on); ``text`` itself when it has none (most lines)."""
    if _CONTROLS.search(text) is None:
        return text
    return _CONTROLS.sub(_escaped, text)


def _escape_lines(text: str) -> str:
    """A traceback or stack: each line escaped, the lines after the first indented."""
    return "\n  ".join(escape(line) for line in text.splitlines())


class EscapeControls(logging.Filter):
    """A handler's filter that keeps every record to one line of escaped text (its traceback
    indented below it). Changes the record in place (each handler after sees it so); a record
    escaped already stays as it is."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, _DONE, False):
            return True
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a bad format string: the handler reports it as it would
            return True
        record.msg, record.args = escape(message), None
        if record.exc_info and not record.exc_text:
            record.exc_text = _FORMATTER.formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = _escape_lines(record.exc_text)
        if record.stack_info:
            record.stack_info = _escape_lines(record.stack_info)
        setattr(record, _DONE, True)
        return True


def escape_handlers(logger: logging.Logger) -> None:
    """Give each of ``logger``'s handlers the :class:`EscapeControls` filter (once)."""
    for handler in logger.handlers:
        if not any(isinstance(f, EscapeControls) for f in handler.filters):
            handler.addFilter(EscapeControls())
