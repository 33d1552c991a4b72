"""The admin, composed: ``django.contrib.admin`` with the project's console as its default site.

Listed in ``INSTALLED_APPS`` in place of ``django.contrib.admin``, so that ``admin.site`` (and
every ``@admin.register`` of every app) is the console's :class:`~consoles.admin_site.ConsoleSite`.
It lives in ``config/`` (the composition root) because ``queues`` registers its models on the
site without knowing the console, and because an ``AdminConfig`` subclass in ``consoles/apps.py``
would compete with ``ConsolesConfig`` as that app's default configuration.
"""

from django.contrib.admin.apps import AdminConfig


class MQAdminConfig(AdminConfig):
    default_site = "consoles.admin_site.ConsoleSite"
