from django.apps import AppConfig


class QueuesConfig(AppConfig):
    name = "queues"
    verbose_name = "Queues"

    def ready(self) -> None:
        # The service reaches other nodes through the REST API: the transport is the API's.
        from django.conf import settings

        from queues import access, tracing
        from queues.api.peers import HttpPeers
        from queues.service import set_peers

        set_peers(HttpPeers())
        access.connect_signals()
        # Once per process: spans or none (queues.tracing).
        tracing.configure(settings.TRACES_EXPORT, settings.TRACES_FILE, settings.NODE_ADDRESS)
