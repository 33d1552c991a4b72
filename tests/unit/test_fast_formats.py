"""Hot-path replacements of library calls must give the very same text: the API's time format
(``service.iso``, one per delivered message) against ``datetime.isoformat``."""

from __future__ import annotations

from datetime import UTC, datetime

from hypothesis import given
from hypothesis import strategies as st

from queues.engine.isotime import iso, isoformat


def reference_iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@given(ts=st.floats(min_value=0, max_value=253_402_300_799, allow_nan=False))
def test_iso_is_isoformat_with_milliseconds(ts):
    assert iso(ts) == reference_iso(ts)


@given(second=st.integers(min_value=0, max_value=4_000_000_000), micro=st.integers(min_value=0, max_value=999_999))
def test_iso_rounds_like_datetime_near_every_boundary(second, micro):
    # microseconds round half to even before the milliseconds are cut: x.9999995 is the next second
    for ts in (second + micro / 1e6, second + (micro + 0.5) / 1e6, second + 0.9999995, second + 0.0005):
        assert iso(ts) == reference_iso(ts)


def test_iso_examples():
    assert iso(0) == "1970-01-01T00:00:00.000Z"
    assert iso(1_763_941_234.123456) == reference_iso(1_763_941_234.123456)
    assert iso(1_763_941_234.9999996) == "2025-11-23T23:40:35.000Z"


def test_iso_of_the_time_before_and_of_another_alternating():
    """The last time's text is kept (a batch shares one time): asked again, or after another."""
    a, b = 1_763_941_234.123456, 1_763_941_299.5
    for ts in (a, a, b, a, b, b, 0.0, a):
        assert iso(ts) == reference_iso(ts)


@given(ts=st.floats(min_value=0, max_value=253_402_300_799, allow_nan=False))
def test_iso_is_the_one_formatter_s_text(ts):
    assert iso(ts) == isoformat(ts) == isoformat(datetime.fromtimestamp(ts, tz=UTC))


def test_isoformat_of_datetimes_seconds_and_none():
    aware = datetime(2025, 11, 23, 23, 40, 35, 123456, tzinfo=UTC)
    assert isoformat(aware) == "2025-11-23T23:40:35.123Z"
    assert isoformat(aware, "microseconds") == "2025-11-23T23:40:35.123456Z"
    assert isoformat(aware.replace(tzinfo=None)) == "2025-11-23T23:40:35.123Z"  # naive: UTC
    assert isoformat(datetime(2025, 1, 1, tzinfo=UTC), "microseconds") == "2025-01-01T00:00:00.000000Z"
    assert isoformat(None) is None
