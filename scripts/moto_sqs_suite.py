#!/usr/bin/env python
"""Run moto's AWS-verified SQS tests against one node: an SQS suite that others wrote and
checked against AWS itself, not against this project.

    scripts/with-services.sh python scripts/moto_sqs_suite.py --moto-src DIR --moto-python PY [pytest args]

``--moto-src``: moto's source tree (its sdist, ``pip download --no-binary :all: --no-deps
moto``, unpacked: the tests are in it); ``--moto-python``: a Python with moto, pytest and
freezegun installed (a virtual environment of its own, not the project's). The tests marked
``aws_verified`` (tests/test_sqs/test_sqs.py by default) run with
``MOTO_TEST_ALLOW_AWS_REQUEST=true``, so moto mocks nothing: boto3 goes to the node
(``AWS_ENDPOINT_URL_SQS``) with an access key of a user made for the run. STS, whose
GetCallerIdentity their ``account_id`` fixture calls, is a stand-in here that answers the
account the node's queue URLs name (a node serves no STS). It prints pytest's report and
exits with its status.

It needs the network only to fetch moto, so it is not part of ``make test``; its last result
is in the README (the SQS API's section).
"""

from __future__ import annotations

import argparse
import http.server
import os
import subprocess
import sys
import threading
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

import boto3  # noqa: E402
from common import BenchNode  # noqa: E402


def sts_stand_in(account: str, key_id: str) -> http.server.ThreadingHTTPServer:
    """A local STS that answers every call with GetCallerIdentity's answer for ``account``."""
    body = (
        '<GetCallerIdentityResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/"><GetCallerIdentityResult>'
        f"<Arn>arn:aws:iam::{account}:user/moto-suite</Arn><UserId>{key_id}</UserId><Account>{account}</Account>"
        "</GetCallerIdentityResult><ResponseMetadata><RequestId>0</RequestId></ResponseMetadata>"
        "</GetCallerIdentityResponse>"
    ).encode()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self.send_response(200)
            self.send_header("Content-Type", "text/xml")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--moto-src", required=True, help="moto's unpacked source tree (its tests/ included)")
    p.add_argument("--moto-python", required=True, help="a Python with moto, pytest and freezegun")
    p.add_argument("--redis-url", default=os.environ.get("MQ_TEST_REDIS_URL", "redis://127.0.0.1:63799"))
    p.add_argument("--pg-url", default=os.environ.get("MQ_TEST_PG_URL", "postgres://mq:mq@127.0.0.1:54329/mq"))
    p.add_argument("--kv-redis-db", type=int, default=7)
    a, pytest_args = p.parse_known_args()

    node = BenchNode(
        "node", "redis", database_url=a.pg_url, redis_url=a.redis_url, kv_redis_db=a.kv_redis_db, user="moto-suite"
    )
    node.start()
    try:
        key_id, secret = node.sqs_key("moto")
        sqs = boto3.client(
            "sqs",
            endpoint_url=node.url + "/sqs",
            region_name="us-east-1",
            aws_access_key_id=key_id,
            aws_secret_access_key=secret,
        )
        url = sqs.create_queue(QueueName="moto-account-probe")["QueueUrl"]
        sqs.delete_queue(QueueUrl=url)
        sts = sts_stand_in(url.rstrip("/").split("/")[-2], key_id)
        env = dict(
            os.environ,
            MOTO_TEST_ALLOW_AWS_REQUEST="true",
            AWS_ENDPOINT_URL_SQS=node.url + "/sqs",
            AWS_ENDPOINT_URL_STS=f"http://127.0.0.1:{sts.server_address[1]}",
            AWS_ACCESS_KEY_ID=key_id,
            AWS_SECRET_ACCESS_KEY=secret,
            AWS_DEFAULT_REGION="us-east-1",
        )
        env.pop("AWS_ENDPOINT_URL", None)
        argv = pytest_args or ["tests/test_sqs/test_sqs.py"]
        cmd = [a.moto_python, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rA", "-m", "aws_verified", *argv]
        return subprocess.run(cmd, cwd=a.moto_src, env=env, check=False).returncode
    finally:
        node.stop()


if __name__ == "__main__":
    sys.exit(main())
