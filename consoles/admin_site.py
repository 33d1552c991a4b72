"""The console: the project's own admin site.

It is the default site (``config.apps.MQAdminConfig``), so the models every app registers with
``@admin.register`` appear on it. It adds the overview at ``/admin/overview/``
(``admin:overview``, with its figures at ``/admin/overview.json``), each topic's page at
``/admin/topics/<name>/`` (``admin:topic``) and the dashboards page at
``/admin/dashboards/`` (``admin:dashboards``): in the ``admin`` namespace, behind the admin's
login and staff check, with the admin's look. Its index links to both, the overview first
(``templates/consoles/admin_index.html``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import wraps
from typing import Any, TypeVar, cast

from django.conf import settings
from django.contrib import admin
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.views.main import ChangeList as DjangoChangeList
from django.core.exceptions import ValidationError
from django.db import connections, models
from django.db.models import QuerySet
from django.db.models.base import ModelBase
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest
from django.http.response import HttpResponseBase
from django.urls import URLPattern, URLResolver, path

from consoles import forms, login_guard, overview, topics, views

_ModelT = TypeVar("_ModelT", bound=models.Model)
_ViewType = TypeVar("_ViewType", bound=Callable[..., HttpResponseBase])


class ConsoleSite(admin.AdminSite):
    site_header = "mq console"
    site_title = "mq console"
    index_title = "Queues, partitions, nodes and workers"
    index_template = "consoles/admin_index.html"
    site_url = None  # no "view site" link: the node serves an API, nothing at "/"

    def register(
        self,
        model_or_iterable: type[_ModelT] | Iterable[type[_ModelT]],
        admin_class: type[admin.ModelAdmin[_ModelT]] | None = None,
        **options: Any,
    ) -> None:
        """Register as Django's site does, with the checks Django's model admins lack (each
        answered 500): every JSON field and every choice of several rows in their forms is the
        console's (:mod:`consoles.forms`: an integer of 4,301 digits, a value nested thousands
        deep; a key past 64 bits), an action's selection must be primary keys
        (:func:`_checked_selection`), and a date hierarchy's date one a datetime holds
        (:class:`ChangeList`)."""
        registered = [model_or_iterable] if isinstance(model_or_iterable, ModelBase) else list(model_or_iterable)
        super().register(registered, admin_class, **options)
        for model in registered:
            model_admin = self._registry[model]
            # ModelAdmin.__init__ makes the class's mapping a dict of dicts of the instance's own.
            overrides = cast("dict[type[models.Field[Any, Any]], dict[str, Any]]", model_admin.formfield_overrides)
            overrides.setdefault(models.JSONField, {}).setdefault("form_class", forms.JSONField)
            overrides.setdefault(models.ManyToManyField, {}).setdefault("form_class", forms.ModelMultipleChoiceField)
            # Replaced on the instance: every registered admin gets them, whatever its class.
            model_admin.response_action = _checked_selection(model_admin)  # type: ignore[method-assign]
            if type(model_admin).get_changelist is admin.ModelAdmin.get_changelist:
                model_admin.get_changelist = _changelist  # type: ignore[method-assign]

    def admin_view(self, view: _ViewType, cacheable: bool = False) -> _ViewType:
        """Django's admin view, which first refuses (400) a request with a NUL character in its
        path or in any name or value of its query or form (:func:`_has_nul`): PostgreSQL holds
        none in text, and a NUL reaching a query (an object's ID, a filter's value, the
        autocomplete's term) raised DataError there, a 500. No console input means one."""
        inner = super().admin_view(view, cacheable)

        @wraps(inner)
        def checked(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
            if _has_nul(request, args, kwargs):
                return HttpResponseBadRequest(
                    "A NUL character is no part of any page or form of the console.\n",
                    content_type="text/plain; charset=utf-8",
                )
            return inner(request, *args, **kwargs)

        return cast(_ViewType, checked)  # the view's own signature, wrapped

    def get_urls(self) -> list[URLResolver | URLPattern]:
        return [
            path("overview/", self.admin_view(self.overview), name="overview"),
            path("overview.json", self.admin_view(overview.overview_json), name="overview_json"),
            path("topics/<str:name>/", self.admin_view(self.topic), name="topic"),
            path("dashboards/", self.admin_view(self.dashboards), name="dashboards"),
            *super().get_urls(),
        ]

    def login(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        """The admin's login, refused (429) after too many failures (:mod:`consoles.login_guard`)."""
        if request.method == "POST" and login_guard.refused(request):
            return HttpResponse(
                "Too many failed logins: try again later.\n",
                status=429,
                content_type="text/plain; charset=utf-8",
                headers={"Retry-After": str(settings.ADMIN_LOGIN_WINDOW)},
            )
        response = super().login(request, extra_context)
        if request.method == "POST" and response.status_code == 200 and not request.user.is_authenticated:
            login_guard.failed(request)  # the form came back: wrong password, or not staff
        return response

    def overview(self, request: HttpRequest) -> HttpResponse:
        """The overview page (:mod:`consoles.overview`), in this site's frame."""
        return overview.overview(request, self)

    def topic(self, request: HttpRequest, name: str) -> HttpResponse:
        """A topic's page (:mod:`consoles.topics`), in this site's frame."""
        return topics.topic(request, name, self)

    def dashboards(self, request: HttpRequest) -> HttpResponse:
        """The dashboards page (:func:`consoles.views.dashboards`), in this site's frame."""
        return views.dashboards(request, self)


class ChangeList(DjangoChangeList):
    """Django's changelist, which takes a date hierarchy's year, month and day that make no
    date (``2147483648``; December 31st of 9999, whose next day is none) as any parameter it
    cannot use (``?e=1``): Django caught the ValueError of a day that is not, not the
    OverflowError of a number past C's int, nor the errors of the day after."""

    def get_filters(self, request: HttpRequest) -> Any:
        try:
            return super().get_filters(request)
        except (OverflowError, ValueError) as exc:
            prefix = f"{self.date_hierarchy}__"
            if not self.date_hierarchy or not any(key.startswith(prefix) for key in request.GET):
                raise
            raise IncorrectLookupParameters(exc) from exc


def _changelist(request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
    return ChangeList


def _has_nul(request: HttpRequest, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether the request's path, its URL's arguments, or a name or a value of its query
    string or form holds a NUL (files aside)."""
    texts = [request.path, *map(str, args), *map(str, kwargs.values())]
    for data in (request.GET, request.POST) if request.method == "POST" else (request.GET,):
        for key, values in data.lists():
            texts.append(key)
            texts += values
    return any("\x00" in text for text in texts)


def _checked_selection(
    model_admin: admin.ModelAdmin[Any],
) -> Callable[..., HttpResponse | None]:
    """``model_admin.response_action`` that answers 400 to an action on a selection that is not
    the model's primary keys: Django filters the changelist by it as it is posted
    (``pk__in``), and a value its primary key cannot take (``abc`` for an integer; a NUL,
    which PostgreSQL refuses in text; past 64 bits, which SQLite's integers cannot hold)
    raised there (a 500; the NUL's, an outage's 503)."""
    respond = model_admin.response_action
    pk = model_admin.model._meta.pk
    assert pk is not None

    def response_action(
        request: HttpRequest, queryset: QuerySet[Any], *args: Any, **kwargs: Any
    ) -> HttpResponse | None:
        for value in request.POST.getlist(ACTION_CHECKBOX_NAME):
            try:
                if "\x00" in value:
                    raise ValidationError("a NUL character")
                pk.get_prep_value(pk.to_python(value))
                if not forms.within_range(pk, value, connections[queryset.db]):
                    raise ValidationError("past the key's column")
            except (ValidationError, ValueError, TypeError):
                return HttpResponseBadRequest(
                    f"An action's selection is of {model_admin.model._meta.verbose_name_plural}: "
                    f"{value[:64]!r} is none of theirs.\n",
                    content_type="text/plain; charset=utf-8",
                )
        return respond(request, queryset, *args, **kwargs)  # (Django 6 adds where the action was chosen)

    return response_action
