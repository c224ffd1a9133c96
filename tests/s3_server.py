"""An S3-protocol server on 127.0.0.1 (moto's ThreadedMotoServer) for s3:// tests: real HTTP, the real s3fs.

`moto_s3()` yields the standard AWS environment variables that point s3fs (through botocore) at it. The fixtures
`s3_env` (the server for the session, its variables set in this process meanwhile) and `bucket` (a fresh bucket per
test) are used by importing them into a conftest:

    from tests.s3_server import bucket, s3_env  # noqa: F401  (fixtures)
"""

import contextlib
import logging
from collections.abc import Iterator

import pytest
import s3fs
from moto.server import ThreadedMotoServer


@contextlib.contextmanager
def moto_s3() -> Iterator[dict[str, str]]:
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one log line per request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield {
            "AWS_ENDPOINT_URL": f"http://{host}:{port}",
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
        }
    finally:
        server.stop()


@pytest.fixture(scope="session")
def s3_env():
    """moto's S3 server for the session; the AWS variables pointing at it are set in this process meanwhile."""
    with moto_s3() as env, pytest.MonkeyPatch.context() as mp:
        for key, value in env.items():
            mp.setenv(key, value)
        mp.delenv("AWS_PROFILE", raising=False)
        s3fs.S3FileSystem.clear_instance_cache()  # an instance made before would keep the old endpoint
        yield env
    s3fs.S3FileSystem.clear_instance_cache()


@pytest.fixture
def bucket(s3_env, request) -> str:
    """A fresh, empty bucket named after the test."""
    name = "t-" + "".join(c if c.isalnum() else "-" for c in request.node.name.lower())[:50].strip("-")
    s3fs.S3FileSystem().mkdir(name)
    return name
