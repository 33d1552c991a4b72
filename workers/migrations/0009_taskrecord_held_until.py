"""Tasks due beyond the service's delay limit are held in the database until a relay sends
them, as their writer (the user of the enqueuing client's token; no token is stored)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("workers", "0008_outbox_writer"),
    ]

    operations = [
        migrations.AddField(
            model_name="taskrecord",
            name="held_until",
            field=models.DateTimeField(blank=True, db_index=True, null=True),
        ),
        migrations.AddField(
            model_name="taskrecord",
            name="writer_id",
            field=models.BigIntegerField(
                blank=True, help_text="the user a relay sends the held task's message as", null=True
            ),
        ),
    ]
