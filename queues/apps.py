from django.apps import AppConfig


class QueuesConfig(AppConfig):
    name = "queues"
    verbose_name = "Queues"

    def ready(self) -> None:
        # The service reaches other nodes through the REST API: the transport is the API's.
        from queues import access
        from queues.api.peers import HttpPeers
        from queues.service import set_peers

        set_peers(HttpPeers())
        access.connect_signals()
