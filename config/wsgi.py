import os
from wsgiref.types import WSGIApplication

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
django_application = get_wsgi_application()

from queues.api.fastpath import FastPath  # noqa: E402
from queues.http.bodies import BodyGate  # noqa: E402  (needs Django set up)

#: The message calls take a fast path in front of Django; see queues/api/fastpath.py. Django
#: gets a body of a caller not yet known only small and whole: see queues/api/bodies.py.
application: WSGIApplication = FastPath(BodyGate(django_application))
