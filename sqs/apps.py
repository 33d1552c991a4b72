from django.apps import AppConfig


class SqsConfig(AppConfig):
    name = "sqs"
    verbose_name = "SQS API"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from queues.api.bodies import register_known_caller, register_self_guarded
        from queues.api.fastpath import register_direct_view
        from sqs import keys
        from sqs.known import access_key_known, is_sqs_call
        from sqs.views import direct_endpoint

        # A caller with an access key sends its body whole (SendMessageBatch: up to 1 MiB).
        register_known_caller(access_key_known)
        # The SQS view refuses a key it does not know before it reads a body, in SQS's words.
        register_self_guarded(is_sqs_call)
        # Its POSTs need none of Django's middleware: the fast path serves them without it.
        register_direct_view("/sqs", direct_endpoint)
        # A key or a user changed: every process reads its keys again from its next call on.
        keys.connect()
