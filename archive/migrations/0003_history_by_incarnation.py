"""Archived messages tied to their queue's row (its incarnation), not only to its name."""

from django.db import migrations, models


def backfill(apps, schema_editor):
    """Each row to the queue now of its name, if that queue existed when the message was
    enqueued. Rows older than it are an earlier incarnation's (the name was deleted and used
    again) or of a queue gone: they stay empty, read by superusers only."""
    Queue = apps.get_model("queues", "Queue")
    ArchivedMessage = apps.get_model("archive", "ArchivedMessage")
    for pk, name, created_at in Queue.objects.values_list("pk", "name", "created_at"):
        ArchivedMessage.objects.filter(queue=name, incarnation__isnull=True, enqueued_at__gte=created_at).update(
            incarnation=pk
        )


class Migration(migrations.Migration):
    dependencies = [
        ("archive", "0002_surface"),
        ("queues", "0008_block_growth"),
    ]

    operations = [
        migrations.AddField(
            model_name="archivedmessage",
            name="incarnation",
            field=models.BigIntegerField(
                blank=True,
                help_text="the id of the queue's row (kept after deletion; a re-created queue has another)",
                null=True,
            ),
        ),
        migrations.AddIndex(
            model_name="archivedmessage",
            index=models.Index(fields=["incarnation", "enqueued_at"], name="archive_incarnation_enqueued"),
        ),
        migrations.RunPython(backfill, migrations.RunPython.noop),
    ]
