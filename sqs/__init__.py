"""The SQS-compatible API: Amazon SQS's wire protocols over this service's queues.

``sigv4`` checks AWS Signature Version 4 against the ``AccessKey`` rows; ``wire`` decodes and
encodes the AWS JSON 1.0 protocol (what boto3 sends); ``query`` the older query protocol; both
meet in the JSON protocol's request and response dicts, which ``actions`` turns into calls of
``queues.service`` for the key's user, with the REST API's permissions.
"""
