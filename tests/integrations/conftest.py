"""Fixtures of the task tests: an S3-protocol server on loopback that this process's s3fs talks to."""

from tests.s3_server import bucket, s3_env  # noqa: F401  (fixtures)
