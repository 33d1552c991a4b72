from django.apps import AppConfig


class ArchiveConfig(AppConfig):
    name = "archive"
    verbose_name = "archive"
    default_auto_field = "django.db.models.BigAutoField"
