"""The SQS-compatible API: Amazon SQS's wire protocols over this service's queues.

``sigv4`` checks AWS Signature Version 4 against the ``AccessKey`` rows; ``wire`` decodes and
encodes the AWS JSON 1.0 protocol (what boto3 sends); ``query`` the older query protocol; both
meet in the JSON protocol's request and response dicts, which ``actions`` turns into calls of
``queues.service`` for the key's user, with the REST API's permissions: ``attributes`` (a
queue's attributes and SQS's own bounds), ``message_attributes`` (their check, storage and MD5),
``move_tasks`` (the service's redrive as a message move task), over ``context`` (the call's
context, queue names and URLs, the service's errors as SQS's).
"""
