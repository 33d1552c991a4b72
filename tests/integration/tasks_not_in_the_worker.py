"""A task the test process registers (its ``TASKS`` lists this module) and the worker of
tests/integration/test_django_tasks.py does not (its ``TASKS_MODULES`` leaves it out): a task
whose module the worker does not have."""

try:
    from django.tasks import task
except ImportError:
    from django_tasks import task


@task
def left_behind(n):
    return n
