"""The node's HTTP edge, shared by every HTTP entrance: the REST API (``queues.api``), the SQS
API (``sqs``), and the workers' and the archive's own endpoints.

Who is calling (``auth``: a token's user, a node's signed call, the hops a call has made),
how often they may (``throttles``), what a body may be before it is read (``bodies``, the node's
``front`` that reads it on its event loop, with the apps' registries of checks and refusals),
the views that need none of Django's middleware (``direct``), request validation
(``validation``, ``serializers``), JSON in and out (``parsers``, ``renderers``) and the mapping of
errors to statuses (``errors``). It sits over the service layer and under the entrances: it
knows HTTP, not any one API's resources.
"""
