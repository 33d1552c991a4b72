from django.apps import AppConfig


class ArchiveConfig(AppConfig):
    name = "archive"
    verbose_name = "archive"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # The core never imports this app: it takes the archive table as its topics' archive.
        from queues.node import install_archive

        from .archiver import lookup, store_records

        install_archive(store_records, lookup)
