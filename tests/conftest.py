"""Shared fixtures. A tiny chunk size makes small test tensors span many chunks."""

import os

import pytest

import mvc

SMALL_CHUNK = 64


def same(a: dict, b: dict) -> bool:
    """Two flat states hold the same keys, tensors equal bit for bit and other values equal."""
    import torch
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) if isinstance(a[k], torch.Tensor) else a[k] == b[k]
                                        for k in a)


@pytest.fixture
def repo(tmp_path):
    r = mvc.Repository.init(tmp_path, chunk_size=SMALL_CHUNK)
    yield r
    r.close()


def run_cli(repo, *args):
    """``mvc -C REPO ARGS`` through click's runner (stdout and stderr apart); ``repo`` is a
    Repository or its folder."""
    from click.testing import CliRunner
    from mvc.cli import main
    folder = repo if isinstance(repo, (str, os.PathLike)) else repo.root
    return CliRunner().invoke(main, ["-C", str(folder), *map(str, args)])


def pushed_repo(path, url: str, endpoint, commits, chunk_size: int):
    """A new repository at ``path`` with one commit per (state, message) of ``commits``,
    remote origin at ``url`` (``endpoint`` for S3) and main pushed there."""
    import mvc
    repo = mvc.Repository.init(path, chunk_size=chunk_size)
    for state, message in commits:
        repo.commit(state, message)
    repo.remotes.add("origin", url, endpoint)
    repo.remotes.push()
    return repo


from s3server import moto, moto_bucket, moto_server, s3, s3_bucket, s3_server, s3_url, seaweedfs  # noqa: E402,F401  (the session's SeaweedFS, for tests/test_remote*.py)


@pytest.fixture
def cli(tmp_path, monkeypatch):
    """``mvc ARGS`` run in a fresh repository (64-byte chunks) in tmp_path;
    asserts the exit code (``code=``, default 0) and returns click's result."""
    from click.testing import CliRunner
    from mvc.cli import main
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()

    def run(*args, code=0):
        result = runner.invoke(main, [str(a) for a in args], catch_exceptions=False)
        assert result.exit_code == code, (args, result.output, result.stderr)
        return result
    assert "Initialized" in run("init", "--chunk-size", str(SMALL_CHUNK)).output
    return run
