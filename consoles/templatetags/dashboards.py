"""Filters for the dashboards page: seconds and rates the way the charts write them."""

from django import template

from consoles.charts import format_value

register = template.Library()


@register.filter
def secs(value: float | None) -> str:
    """``0.0123`` -> ``12.3 ms``; ``None`` -> ``-``."""
    return format_value(value, "s")


@register.filter
def pct(value: float | None) -> str:
    """``0.25`` -> ``25.0 %``."""
    return format_value(value, "%")


@register.filter
def num(value: float | None) -> str:
    """Three significant digits, ``-`` for nothing."""
    return format_value(value)
