"""Outbox rows record their writer, and a relay that may not send one as its writer gives it up
with the reason. Columns only added, nullable or with a database default: a process of the
previous version reads and writes the table as before."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("workers", "0007_outboxmessage_claimed_until"),
    ]

    operations = [
        migrations.AddField(
            model_name="outboxmessage",
            name="writer_id",
            field=models.BigIntegerField(blank=True, help_text="the user a relay sends it as", null=True),
        ),
        migrations.AddField(
            model_name="outboxmessage",
            name="given_up_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="outboxmessage",
            name="given_up_reason",
            field=models.TextField(blank=True, db_default=""),
        ),
    ]
