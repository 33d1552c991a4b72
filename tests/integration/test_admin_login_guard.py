"""A burst of failed console logins is refused (429) for the window, even with the right password."""

from __future__ import annotations

import pytest
from django.test import Client, RequestFactory, override_settings

from consoles import login_guard


@pytest.fixture
def forget_failures():
    """The counts live in the cache (Redis in the suite): forget this client's after the test."""
    tried: list[tuple[str, str]] = []  # (username, address)
    yield tried
    for name, address in tried:
        login_guard.forget(RequestFactory().post("/admin/login/", {"username": name}, REMOTE_ADDR=address))


@override_settings(ADMIN_LOGIN_FAILURES=3)
def test_a_burst_of_failed_logins_is_refused_until_the_window_ends(db, django_user_model, forget_failures):
    # given a staff user
    django_user_model.objects.create_user("ops", password="right-pw", is_staff=True)
    forget_failures.append(("ops", "127.0.0.1"))
    client = Client()

    def attempt(password: str):
        return client.post("/admin/login/?next=/admin/", {"username": "ops", "password": password})

    # when three wrong passwords are tried, the form says so each time
    assert [attempt(f"guess-{i}").status_code for i in range(3)] == [200, 200, 200]
    # then the next attempt is refused, the right password too, and says when to come back
    refused = attempt("guess-4")
    assert refused.status_code == 429 and refused["Retry-After"] == "900"
    right = attempt("right-pw")
    assert right.status_code == 429 and "_auth_user_id" not in client.session
    # and another user from elsewhere is not affected
    django_user_model.objects.create_user("ops2", password="other-pw", is_staff=True)
    forget_failures.append(("ops2", "10.0.0.9"))
    other = Client(REMOTE_ADDR="10.0.0.9").post(
        "/admin/login/?next=/admin/", {"username": "ops2", "password": "other-pw"}
    )
    assert other.status_code == 302


@override_settings(ADMIN_LOGIN_FAILURES=2)
def test_one_address_trying_many_names_is_refused(db, forget_failures):
    client = Client(REMOTE_ADDR="10.0.0.77")
    names = [f"who-{i}" for i in range(9)]
    forget_failures.extend((n, "10.0.0.77") for n in names)
    codes = [client.post("/admin/login/", {"username": n, "password": "x"}).status_code for n in names]
    # 2 per name, 8 per address: the ninth name from the address is refused
    assert codes == [200] * 8 + [429]
