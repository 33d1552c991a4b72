"""One log record, one line (``config.logs``): control characters in a record's message,
traceback and stack are escaped, on Django's handlers and on a Celery worker's."""

from __future__ import annotations

import io
import logging

import pytest

from config.logs import EscapeControls, escape, escape_handlers

FORGED = "x\n2025-01-01 00:00:00,000 ERROR queues forged line\x1b[2J\u2028"


def _logger(name: str) -> tuple[logging.Logger, io.StringIO]:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s %(message)s"))
    handler.addFilter(EscapeControls())
    logger = logging.getLogger(name)
    logger.handlers = [handler]
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    return logger, out


@pytest.mark.parametrize(
    ("text", "escaped"),
    [
        ("plain text, é and ✓", "plain text, é and ✓"),
        ("a\nb\rc\td", "a\\nb\\rc\\td"),
        ("\x1b[31mred\x07", "\\x1b[31mred\\x07"),
        ("\x85\u2028\u2029\u202e", "\\x85\\u2028\\u2029\\u202e"),
    ],
)
def test_escape(text, escaped):
    assert escape(text) == escaped


def test_a_record_with_a_forged_line_stays_one_line():
    logger, out = _logger("t.escape.message")
    logger.warning("Member doesn't match the w3c identifiers format %s", FORGED)
    lines = out.getvalue().splitlines()
    assert lines == [
        (
            "WARNING t.escape.message Member doesn't match the w3c identifiers format "
            "x\\n2025-01-01 00:00:00,000 ERROR queues forged line\\x1b[2J\\u2028"
        )
    ]


def test_a_traceback_keeps_its_lines_indented_and_its_message_cannot_start_a_record():
    logger, out = _logger("t.escape.traceback")
    try:
        raise ValueError(FORGED)
    except ValueError:
        logger.exception("failed")
    lines = out.getvalue().splitlines()
    assert lines[0] == "ERROR t.escape.traceback failed"
    assert lines[1] == "Traceback (most recent call last):"
    assert all(line.startswith("  ") for line in lines[2:]), lines
    assert "\x1b" not in out.getvalue() and "\u2028" not in out.getvalue()


def test_a_record_is_escaped_once_whatever_the_handlers():
    logger, out = _logger("t.escape.twice")
    second = io.StringIO()
    handler = logging.StreamHandler(second)
    handler.addFilter(EscapeControls())
    logger.addHandler(handler)
    try:
        raise ValueError("boom")
    except ValueError:
        logger.exception("a\nb")
    assert second.getvalue().splitlines()[0] == "a\\nb"
    assert out.getvalue().split("\n", 1)[1] == second.getvalue().split("\n", 1)[1]


def test_escape_handlers_adds_the_filter_once():
    logger = logging.getLogger("t.escape.handlers")
    logger.handlers = [logging.StreamHandler(io.StringIO())]
    escape_handlers(logger)
    escape_handlers(logger)
    assert [type(f) for f in logger.handlers[0].filters] == [EscapeControls]


def test_the_nodes_and_the_workers_handlers_escape():
    from celery.signals import after_setup_logger
    from django.conf import settings

    import config.celery  # noqa: F401 - connects the worker's logging signals

    # the nodes: Django's LOGGING gives its console handler the filter
    assert settings.LOGGING["handlers"]["console"]["filters"] == ["escape"]
    assert settings.LOGGING["filters"]["escape"]["()"] == "config.logs.EscapeControls"
    # the worker: Celery's own handlers get it once Celery has set them up
    logger = logging.getLogger("t.escape.celery")
    logger.handlers = [logging.StreamHandler(io.StringIO())]
    after_setup_logger.send(sender=None, logger=logger, loglevel=logging.INFO, logfile=None, format="", colorize=False)
    assert any(isinstance(f, EscapeControls) for f in logger.handlers[0].filters)
