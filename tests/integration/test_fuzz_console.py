"""The console (the admin at ``/admin/``) fuzzed: its URLs and its forms, as a staff user and as a
superuser, never answer a 5xx (a 503 neither: no outage happens in this process).

Every registered model admin is found on the site (none is named here): its changelist with
query parameters (its own filters' parameters, found from the changelist, its search, ordering
and page, and names it does not know), its add, change, history and delete pages with any
object ID, the forms of its add and change pages posted back with hostile values in their
fields (and in the inlines' management forms), its actions posted with any selection; and the
site's own pages (the overview and its figures, a topic's page, the dashboards, a partition's
block, the autocomplete, the password change). Values come from ``tests/fuzzing.py``: numbers
past any range, deep nesting, wrong types, control characters and NUL, huge strings.

The staff user has every permission of the registered models but no grant on the superuser's
queues (so the service layer refuses or hides what is not theirs); passwords are hashed with
MD5 here (a form that sets one would cost half a second a case otherwise).
"""

from __future__ import annotations

import contextlib
import sys
import uuid
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote_from_bytes

import pytest
from django.contrib import admin
from django.contrib.auth.models import Permission, User
from django.contrib.contenttypes.models import ContentType
from django.core import signals
from django.core.exceptions import ValidationError
from django.db import IntegrityError, models, transaction
from django.test import Client, RequestFactory
from django.utils import timezone
from hypothesis import given
from hypothesis import strategies as st

from queues import service
from queues.access import Caller
from queues.models import Queue
from tests import fuzzing
from tests.fuzzing import KINDS, fuzz_settings, hostile, text_of

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("purge_kv")]

ROLES = ("staff", "superuser")


# --- the calls ----------------------------------------------------------------------------------
def _quoted(value: Any) -> str:
    return quote_from_bytes(text_of(value).encode("utf-8", "surrogatepass"), safe="")


Pairs = dict[str, Any] | list[tuple[str, Any]]


def _query(params: Pairs) -> str:
    pairs = params.items() if isinstance(params, dict) else params
    return "&".join(f"{_quoted(k)}={_quoted(v)}" for k, v in pairs)


@dataclass
class Console:
    """One logged-in user's calls to the console; each answer checked and counted."""

    user: User
    role: str
    #: the staff user's permissions (every one of the registered models'); none for the superuser
    permissions: list[Permission] = field(default_factory=list)
    admins: list[ModelPages] = field(default_factory=list)
    pages: list[str] = field(default_factory=list)
    client: Client = field(default_factory=lambda: Client(raise_request_exception=False))

    def login(self) -> None:
        """Signed in as the role's user, as it was: a case may have changed or deleted it
        (a user's change form posted back), or changed its password (which ends its session)."""
        flags = {"is_staff": True, "is_active": True, "is_superuser": self.role == "superuser"}
        if not User.objects.filter(pk=self.user.pk).update(**flags):
            self.user.pk = None
            self.user.username = f"fz-{self.role}-{uuid.uuid4().hex[:6]}"
            self.user.save()
        self.user.refresh_from_db()
        self.user.user_permissions.set(self.permissions)
        self.client.force_login(self.user)

    def get(self, path: str, params: Pairs | None = None) -> Any:
        return self._checked("GET", f"{path}?{_query(params)}" if params else path)

    def post(self, path: str, data: Pairs) -> Any:
        body = _query(data).encode("ascii")
        return self._checked("POST", path, body)

    def _checked(self, method: str, path: str, body: bytes = b"") -> Any:
        raised: list[BaseException] = []

        def keep(sender: Any, **kwargs: Any) -> None:
            raised.append(sys.exc_info()[1])  # type: ignore[arg-type]

        signals.got_request_exception.connect(keep, dispatch_uid="fuzz-console")
        try:
            r = self.client.generic(method, path, body, content_type="application/x-www-form-urlencoded")
        finally:
            signals.got_request_exception.disconnect(dispatch_uid="fuzz-console")
        fuzzing.record(f"console-{self.role}", r.status_code, f"{method} {path} {body[:200]!r}")
        problem = fuzzing.server_error(r.status_code, r.get)
        if problem is not None:
            sent = f"{method} {path[:1500]!r} {body[:1500]!r}"
            raise AssertionError(f"{problem}: {sent}\n{r.content[:1500]!r}") from (raised[0] if raised else None)
        return r


@dataclass
class ModelPages:
    """One registered model admin's pages and what they take."""

    label: str  # "queues/queue"
    model_admin: admin.ModelAdmin
    #: its changelist's query parameters: its filters', search, ordering, page...
    params: list[str]
    actions: list[str]
    #: primary keys of its rows, as its URLs quote them
    ids: list[str]

    @property
    def changelist(self) -> str:
        return f"/admin/{self.label}/"


# --- the world ----------------------------------------------------------------------------------
def _fill_one(model: type[models.Model]) -> None:
    """A row of ``model`` with every required field filled in simply (a model the world made
    no row of through the service), or none if the model refuses it."""
    values: dict[str, Any] = {}
    for f in model._meta.concrete_fields:
        if (f.primary_key and isinstance(f, models.AutoField)) or f.has_default() or f.null:
            continue
        if f.is_relation:
            related = f.related_model._default_manager.first()  # type: ignore[union-attr]
            if related is None:
                return
            values[f.name] = related
        elif f.choices:
            values[f.name] = f.choices[0][0]
        elif isinstance(f, models.DateTimeField):
            values[f.name] = timezone.now()
        elif isinstance(f, models.DateField):
            values[f.name] = timezone.now().date()
        elif isinstance(f, models.BooleanField):
            values[f.name] = False
        elif isinstance(f, models.IntegerField | models.FloatField | models.DecimalField):
            values[f.name] = 1
        elif isinstance(f, models.JSONField):
            values[f.name] = {}
        else:
            values[f.name] = f"fz-{uuid.uuid4().hex[:8]}"
    # (a model with rules of its own refuses it: its pages are fuzzed without a row)
    with contextlib.suppress(IntegrityError, ValidationError, ValueError, TypeError), transaction.atomic():
        model._default_manager.create(**values)


def _world(user: User, unique_name: Any) -> None:
    """Queues, a topic and its subscription, a dead-letter queue, messages in flight, a grant,
    through the service as ``user``; then a row of each registered model that has none."""
    caller = Caller.of(user)
    dlq = service.create_queue(caller=caller, name=unique_name("fz-dlq"), partitions=1)
    q = service.create_queue(caller=caller, name=unique_name("fz"), partitions=2, dead_letter_queue=dlq, max_receives=2)
    service.create_queue(caller=caller, name=unique_name("fz-strict"), partitions=1, strict=True)
    topic = service.create_queue(caller=caller, name=unique_name("fz-topic"), kind="topic", partitions=1)
    service.create_subscription(topic, caller=caller, name="fz-sub")
    service.enqueue(q.name, [service.MessageDraft(f"m{i}") for i in range(4)], caller=caller)
    service.dequeue(q.name, caller=caller, max_messages=2, visibility_timeout=3600)
    reader = User.objects.create(username=f"fz-reader-{uuid.uuid4().hex[:6]}")
    service.grant(caller=caller, action="read", user=reader, queue=q)
    for model in admin.site._registry:
        if not model._default_manager.exists():
            _fill_one(model)


def _pages_of(model: type[models.Model], model_admin: admin.ModelAdmin, superuser: User) -> ModelPages:
    request = RequestFactory().get("/")
    request.user = superuser
    params = ["q", "o", "p", "all", "e", "_popup", "_to_field", "_changelist_filters", "_facets", "id__in"]
    for spec in model_admin.get_changelist_instance(request).filter_specs:
        params += spec.expected_parameters()
    if model_admin.date_hierarchy:
        params += [f"{model_admin.date_hierarchy}__{part}" for part in ("year", "month", "day")]
    actions = list(model_admin.get_actions(request))
    ids = [str(pk) for pk in model._default_manager.values_list("pk", flat=True)[:3]]
    return ModelPages(f"{model._meta.app_label}/{model._meta.model_name}", model_admin, params, actions, ids)


@pytest.fixture
def consoles(runtime, user, unique_name, settings) -> dict[str, Console]:
    """The console as a staff user (every permission of the registered models, a queue of
    their own, no grant on the others') and as a superuser (who made the world)."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    superuser = User.objects.create_superuser(username=f"fz-root-{uuid.uuid4().hex[:6]}", password=None)
    _world(superuser, unique_name)
    user.is_staff = True
    user.save()
    types = [ContentType.objects.get_for_model(m) for m in admin.site._registry]
    permissions = list(Permission.objects.filter(content_type__in=types))
    service.create_queue(caller=Caller.of(user), name=unique_name("fz-staff"), partitions=1)
    admins = [_pages_of(m, ma, superuser) for m, ma in admin.site._registry.items()]
    queue = Queue.objects.filter(kind="queue").first()
    topic = Queue.objects.filter(kind="topic").first()
    assert queue is not None and topic is not None
    partition = next(a for a in admins if a.label == "queues/partition")
    pages = [
        "/admin/",
        "/admin/overview/",
        "/admin/overview.json",
        f"/admin/topics/{topic.name}/",
        "/admin/topics/",
        "/admin/dashboards/",
        "/admin/autocomplete/",
        "/admin/jsi18n/",
        "/admin/password_change/",
        "/admin/password_change/done/",
        f"/admin/queues/partition/{partition.ids[0]}/blocks/x.json",
        f"/admin/r/{ContentType.objects.get_for_model(type(queue)).pk}/{queue.pk}/",
        f"/admin/auth/user/{user.pk}/password/",
        "/admin/queues/",
        "/admin/nope/",
    ]
    return {
        "staff": Console(user, "staff", permissions, admins, pages),
        "superuser": Console(superuser, "superuser", [], admins, pages),
    }


# --- the cases ----------------------------------------------------------------------------------
_GOOD = st.sampled_from(["", "1", "0", "a", "fz", "true", "False", "2026-01-01", "-1", "1,2", "x.y", "%", "None"])


def _value(kind: str | None) -> st.SearchStrategy[Any]:
    return hostile(kind) if kind else (_GOOD | hostile())


@st.composite
def url_cases(draw: st.DrawFn, console: Console, kind: str | None) -> tuple[str, dict[str, Any]]:
    """A page of the console with query parameters, or an object's page under any ID."""
    pages = console.admins
    choice = draw(st.sampled_from(["changelist", "object", "add", "site"]))
    if choice == "site":
        path = draw(st.sampled_from(console.pages))
        names = ["history_after", "queue", "range", "term", "app_label", "model_name", "field_name", "page", "q"]
    else:
        model = draw(st.sampled_from(pages))
        names = model.params
        if choice == "changelist":
            path = model.changelist
        elif choice == "add":
            path = f"{model.changelist}add/"
            names = [*names, "_changelist_filters", "_popup", "_to_field", "name", "queue", "user"]
        else:
            ident = draw(st.sampled_from(model.ids) if model.ids and draw(st.booleans()) else _value(kind))
            page = draw(st.sampled_from(["change/", "history/", "delete/", ""]))
            path = f"{model.changelist}{_quoted(ident)}/{page}"
    keys = st.sampled_from(names) | st.text(max_size=12) if names else st.text(max_size=12)
    params = draw(st.dictionaries(keys, _value(kind), max_size=4))
    return path, params


def _form_fields(page: Any) -> dict[str, Any]:
    """What a browser posts back from an admin add or change page: its form's values and its
    inlines' management forms and rows."""
    data: dict[str, Any] = {}
    context = page.context
    if context is None or "adminform" not in context:
        return data
    for bf in context["adminform"].form:
        v = bf.value()
        if v is True:
            data[bf.html_name] = "on"
        elif v not in (None, False):
            data[bf.html_name] = v
    for inline in context.get("inline_admin_formsets", []):
        formset = inline.formset
        for bf in formset.management_form:
            data[bf.html_name] = bf.value()
        for form in formset.initial_forms:
            for bf in form:
                if bf.value() not in (None, False):
                    data[bf.html_name] = bf.value()
    return data


def _flat(value: Any) -> Any:
    """A form's value: text (a list, as Django's widgets post several, is its first element)."""
    if isinstance(value, list | tuple):
        return value[0] if value else ""
    return value


@st.composite
def form_cases(draw: st.DrawFn, console: Console, kind: str | None) -> tuple[str, dict[str, Any] | None]:
    """(path, data) of a form posted back: an add or change page's with one to four fields
    changed (or added), or a changelist's action on any selection. ``data`` None: the page's
    own form, read from it first (:func:`post_form`)."""
    model = draw(st.sampled_from(console.admins))
    choice = draw(st.sampled_from(["add", "change", "action"]))
    if choice == "action" and model.actions:
        selected = (
            st.lists(st.sampled_from(model.ids) | _value(kind), max_size=3)
            if model.ids
            else st.lists(_value(kind), max_size=2)
        )
        data: dict[str, Any] = {
            "action": draw(st.sampled_from(model.actions) | _value(kind)),
            "_selected_action": draw(selected),
            "index": draw(st.sampled_from(["0", "1"]) | _value(kind)),
        }
        if draw(st.booleans()):
            data["select_across"] = draw(st.sampled_from(["1", "0"]) | _value(kind))
        if draw(st.booleans()):
            data["post"] = "yes"  # an action's confirmation page, confirmed
        return model.changelist, data
    if choice == "change" and model.ids:
        return f"{model.changelist}{_quoted(draw(st.sampled_from(model.ids)))}/change/", None
    return f"{model.changelist}add/", None


def post_form(console: Console, path: str, data: dict[str, Any] | None, draw: st.DrawFn, kind: str | None) -> None:
    if data is not None:  # an action: its selection is one name, repeated
        selected = data.pop("_selected_action")
        console.post(path, [*data.items(), *(("_selected_action", v) for v in selected)])
        return
    page = console.get(path)
    fields = {k: _flat(v) for k, v in _form_fields(page).items()}
    names = sorted(fields) or ["name"]
    for _ in range(draw(st.integers(1, 4))):
        name = draw(st.sampled_from(names) | st.text(min_size=1, max_size=10))
        fields[name] = draw(_value(kind))
    if draw(st.booleans()):
        fields[draw(st.sampled_from(["_save", "_continue", "_addanother", "_saveasnew"]))] = "1"
    console.post(path, fields)


# --- the fuzzing --------------------------------------------------------------------------------
@pytest.mark.parametrize("role", ROLES)
def test_any_console_url_is_answered_never_with_a_5xx(consoles, role):
    console = consoles[role]

    @fuzz_settings(examples=60)
    @given(case=url_cases(console, None))
    def fuzz(case):
        console.login()
        console.get(*case)

    fuzz()


@pytest.mark.parametrize("role", ROLES)
def test_any_console_form_posted_is_answered_never_with_a_5xx(consoles, role):
    console = consoles[role]

    @fuzz_settings(examples=40)
    @given(case=form_cases(console, None), data=st.data())
    def fuzz(case, data):
        console.login()
        post_form(console, *case, data.draw, None)

    fuzz()


@pytest.mark.parametrize("kind", KINDS)
def test_hostile_values_of_each_kind_in_the_console_are_refused_never_with_a_5xx(consoles, kind):
    @fuzz_settings(examples=20)
    @given(role=st.sampled_from(ROLES), url=st.data(), form=st.data())
    def fuzz(role, url, form):
        console = consoles[role]
        console.login()
        console.get(*url.draw(url_cases(console, kind)))
        post_form(console, *form.draw(form_cases(console, kind)), form.draw, kind)

    fuzz()


# --- what the fuzzing found ---------------------------------------------------------------------
@pytest.mark.parametrize(
    "text",
    ["9" * 4_301, "[" * 5_000 + "]" * 5_000, '{"a": "\\u0000"}', '["\\ud800"]'],
    ids=["4301-digits", "5000-deep", "nul", "lone-surrogate"],
)
def test_a_json_field_posted_with_what_json_loads_or_postgresql_refuses_is_a_form_error(consoles, text):
    # Django's forms.JSONField caught JSONDecodeError only: 500 (ValueError, RecursionError),
    # or a save that PostgreSQL refused (consoles.forms.JSONField now)
    console = consoles["superuser"]
    console.login()
    r = console.post("/admin/sqs/queuesettings/add/", {"tags": text, "opaque": text})
    assert r.status_code == 200 and "Enter a valid JSON." in r.content.decode(), r.content[:500]


@pytest.mark.parametrize("role", ROLES)
def test_an_action_on_a_selection_that_is_no_primary_key_is_a_400(consoles, role):
    # Django filters by the selection as posted (pk__in): "abc", "", a float, 5,000 digits
    # raised ValueError (500), a NUL PostgreSQL's DataError (503), 2**64 SQLite's OverflowError
    console = consoles[role]
    console.login()
    for model in console.admins:
        if not model.actions:
            continue
        for selected in ("abc", "", "-6.2e+16", "9" * 5_000, "\x00", "[[[]]]", str(2**64)):
            r = console.post(
                model.changelist, [("action", model.actions[0]), ("index", "0"), ("_selected_action", selected)]
            )
            if (
                model.model_admin.model._meta.pk.get_internal_type() in ("AutoField", "BigAutoField")
                or selected == "\x00"
            ):
                assert r.status_code in (400, 403), (model.label, selected[:20], r.status_code)


@pytest.mark.parametrize("role", ROLES)
def test_a_nul_anywhere_in_a_console_request_is_a_400(consoles, role):
    # PostgreSQL holds no NUL in text: an object's ID, a filter's value or the autocomplete's
    # term with one raised DataError in the query (500)
    console = consoles[role]
    console.login()
    for path, params in (
        ("/admin/queues/node/%00/change/", None),
        ("/admin/workers/consumer/%00/change/", None),
        ("/admin/queues/node/", {"id": "\x00"}),
        ("/admin/queues/queue/", {"kind__exact": "a\x00"}),
        ("/admin/autocomplete/", {"app_label": "queues", "model_name": "grant", "field_name": "queue", "term": "\x00"}),
        ("/admin/dashboards/", {"queue\x00": "x"}),
    ):
        assert console.get(path, params).status_code == 400, (path, params)
    assert console.post("/admin/sqs/queuesettings/add/", {"tags": "{}", "opaque": '"\x00"'}).status_code == 400


@pytest.mark.parametrize("key", [str(2**63), str(2**64), "9" * 5_000, "abc"])
def test_a_choice_of_rows_past_the_key_s_range_is_a_form_error(consoles, key):
    # a group's permissions (a choice of several rows) are looked up with pk__in: on SQLite,
    # the embedded default, a key past 64 bits raised OverflowError (500)
    console = consoles["superuser"]
    console.login()
    group = next(m for m in console.admins if m.label == "auth/group")
    r = console.post(f"{group.changelist}{group.ids[0]}/change/", {"name": "fz-group", "permissions": key})
    assert r.status_code == 200 and "errornote" in r.content.decode(), r.content[:300]


@pytest.mark.parametrize(
    "dates",
    [
        {"year": "2147483648"},  # past C's int: OverflowError
        {"year": "2020", "month": "99999999999"},
        {"year": "9999", "month": "12", "day": "31"},  # no next day: OverflowError
        {"year": "9999", "month": "12"},  # no next month
        {"year": "9999"},  # no next year: ValueError, after Django's own check
    ],
)
def test_a_date_hierarchy_past_what_a_datetime_holds_is_an_unusable_parameter(consoles, dates):
    # Django's changelist caught only the ValueError of a day that is not (500)
    console = consoles["superuser"]
    console.login()
    for model in console.admins:
        field = model.model_admin.date_hierarchy
        if field:
            r = console.get(model.changelist, {f"{field}__{part}": v for part, v in dates.items()})
            assert r.status_code == 302 and r["Location"].endswith("?e=1"), (model.label, r.status_code)
