from django.apps import AppConfig


class SqsConfig(AppConfig):
    name = "sqs"
    verbose_name = "SQS API"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from queues.http.bodies import register_known_caller, register_self_guard_refusal, register_self_guarded
        from queues.http.direct import register_direct_view
        from queues.http.front import register_pre_body_check, register_refusal_renderer
        from sqs import keys
        from sqs.known import access_key_known, is_sqs_call, pre_body, render_refusal, unknown_key
        from sqs.views import direct_endpoint

        # A caller with an access key sends its body whole (SendMessageBatch: up to 1 MiB).
        register_known_caller(access_key_known)
        # The SQS view refuses a key it does not know before it reads a body, in SQS's words.
        register_self_guarded(is_sqs_call)
        # ... and, where a front reads the body before the view runs, is asked the same first.
        register_self_guard_refusal(unknown_key)
        # A signature that cannot be valid is refused before its body, and the front's own
        # refusals of an SQS call are worded as SQS words them.
        register_pre_body_check(pre_body)
        register_refusal_renderer(render_refusal)
        # Its POSTs need none of Django's middleware: the fast path serves them without it.
        register_direct_view("/sqs", direct_endpoint)
        # A key or a user changed: every process reads its keys again from its next call on.
        keys.connect()
