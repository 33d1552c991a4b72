import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
django_application = get_wsgi_application()

from queues.api.fastpath import FastPath  # noqa: E402  (needs Django set up)

#: The message calls take a fast path in front of Django; see queues/api/fastpath.py.
application = FastPath(django_application)
