from django.apps import AppConfig


class ArchiveConfig(AppConfig):
    name = "archive"
    verbose_name = "archive"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # The core never imports this app: it takes the archive table as its topics' archive.
        from archive.archiver import lookup, store_records
        from queues.service.journal import install_archive

        install_archive(store_records, lookup)
