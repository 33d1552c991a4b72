from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("workers", "0006_tasks_outbox"),
    ]

    operations = [
        migrations.AddField(
            model_name="outboxmessage",
            name="claimed_until",
            field=models.DateTimeField(blank=True, null=True),
        ),
    ]
