"""Shared fixtures. A tiny chunk size makes small test tensors span many chunks."""

import pytest

import mvc

SMALL_CHUNK = 64


@pytest.fixture
def repo(tmp_path):
    r = mvc.Repository.init(tmp_path, chunk_size=SMALL_CHUNK)
    yield r
    r.close()


def run_cli(repo, *args):
    """``mvc -C REPO ARGS`` through click's runner (stdout and stderr apart)."""
    from click.testing import CliRunner
    from mvc.cli import main
    return CliRunner().invoke(main, ["-C", str(repo.root), *args])


from s3server import s3_bucket, s3_server, s3_url  # noqa: E402,F401  (the session's SeaweedFS, for tests/test_remote*.py)
