from django.apps import AppConfig


class WorkersConfig(AppConfig):
    name = "workers"

    def ready(self) -> None:
        # The core announces; the workers app keeps the attempt log (the core never imports it).
        from queues import signals
        from workers import receivers

        signals.redelivered.connect(receivers.on_redelivered, dispatch_uid="workers.attempt_log.redelivered")
        signals.given_back.connect(receivers.on_given_back, dispatch_uid="workers.attempt_log.given_back")
        # Celery's tasks carry their sender's trace context when an SDK is configured (the
        # queues app, ready before this one, has installed TRACES_EXPORT's exporter).
        from workers import celery_tracing

        celery_tracing.use()
