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
    ]
