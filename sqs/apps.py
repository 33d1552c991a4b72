from django.apps import AppConfig


class SqsConfig(AppConfig):
    name = "sqs"
    verbose_name = "SQS API"
    default_auto_field = "django.db.models.BigAutoField"
