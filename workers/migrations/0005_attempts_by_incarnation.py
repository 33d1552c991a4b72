"""Attempt records tied to their queue's row (its incarnation), not only to its name."""

from django.db import migrations, models


def backfill(apps, schema_editor):
    """Each record to the queue now of its name, if that queue existed when it was recorded.
    Older records are an earlier incarnation's (the name was deleted and used again) or of a
    queue gone: they stay empty, read by superusers only."""
    Queue = apps.get_model("queues", "Queue")
    AttemptLog = apps.get_model("workers", "AttemptLog")
    for pk, name, created_at in Queue.objects.values_list("pk", "name", "created_at"):
        AttemptLog.objects.filter(queue=name, incarnation__isnull=True, recorded_at__gte=created_at).update(
            incarnation=pk
        )


class Migration(migrations.Migration):
    dependencies = [
        ("workers", "0004_limits"),
        ("queues", "0008_block_growth"),
    ]

    operations = [
        migrations.AddField(
            model_name="attemptlog",
            name="incarnation",
            field=models.BigIntegerField(
                blank=True,
                help_text="the id of the queue's row (kept after deletion; a re-created queue has another)",
                null=True,
            ),
        ),
        migrations.AddIndex(
            model_name="attemptlog",
            index=models.Index(fields=["incarnation", "recorded_at"], name="attempt_incarnation_time"),
        ),
        migrations.RunPython(backfill, migrations.RunPython.noop),
    ]
