"""The private names of dependencies the service relies on (``config/postgresql/base.py``)
still exist with the shape it expects.

A dependency may rename a private name in any release; these tests make an upgrade fail here,
in the unit suite, with the name that went missing, rather than in a node at start-up or under
load. Each module's docstring lists what to check.
"""

from __future__ import annotations

import inspect


def parameter_names(fn) -> list[str]:
    return list(inspect.signature(fn).parameters)


# --- psycopg and Django's PostgreSQL backend --------------------------------------------------
def test_psycopg_wait_and_its_timeout_error_exist():
    import psycopg

    from config.postgresql import base

    assert parameter_names(psycopg.Connection.wait) == ["self", "gen", "interval", "timeout"]
    assert base.WaitTimeout is psycopg.errors._WaitTimeout
    assert issubclass(base.WaitTimeout, psycopg.OperationalError)


def test_django_postgresql_backend_has_the_hooks_overridden():
    from django.db import connection
    from django.db.backends.postgresql.base import DatabaseWrapper

    assert hasattr(DatabaseWrapper, "Database")
    assert parameter_names(DatabaseWrapper.init_connection_state) == ["self"]
    assert parameter_names(DatabaseWrapper.close_if_health_check_failed) == ["self"]
    assert hasattr(connection, "health_check_done")
