"""The catalogue of a remote: what a refresh reads again after this repository's own push."""

import pytest
import torch

from conftest import pushed_repo
from mvc.remote import layout
from mvc.remote.connection import Connection

CHUNK = 1024


def state(seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(8 * 1024, generator=g), "step": seed}


@pytest.fixture(params=["folder", "seaweedfs", "moto"])
def remote(request, tmp_path):
    """(URL, endpoint, put(key, bytes)) of an empty remote of each kind."""
    if request.param == "folder":
        url = str(tmp_path / "remote")
        return url, None, lambda key, data: (tmp_path / "remote" / key).write_bytes(data)
    s3 = request.getfixturevalue(request.param)
    url = s3.url()
    return url, s3.endpoint, lambda key, data: s3.put(url, key, data)


def refresh(repo) -> tuple:
    """(new packs, trailers read) of a refresh of origin's catalogue."""
    conn = Connection(repo, "origin")
    try:
        new = conn.catalogue.refresh(conn.bucket)
        return new, conn.catalogue.trailers_read
    finally:
        conn.close()


def test_a_refresh_after_a_push_reads_none_of_the_trailers_the_push_wrote(remote, tmp_path):
    url, endpoint, _ = remote
    repo = pushed_repo(tmp_path / "a", url, endpoint, [(state(0), "first"), (state(1), "second")], CHUNK)
    try:
        assert refresh(repo) == (0, 0)  # the listing shows the uploads as sent: their stamps taken
        repo.commit(state(2), "third")
        repo.remotes.push()
        assert refresh(repo) == (0, 0)
        assert repo.load("HEAD~2")["step"] == 0
    finally:
        repo.close()


def test_a_pack_changed_after_its_upload_is_read_again_and_left_out(remote, tmp_path):
    url, endpoint, put = remote
    repo = pushed_repo(tmp_path / "a", url, endpoint, [(state(0), "first")], CHUNK)
    try:
        conn = Connection(repo, "origin")
        try:
            key, size = next((k, n) for k, n, _ in conn.bucket.list_stamps(layout.CHUNK_PACKS))
            data = conn.bucket.get(key)
            ids = conn.catalogue.pack_ids()[key]
        finally:
            conn.close()
        put(key, data[:size // 2])  # cut short before any listing was read: not the pack sent
        assert refresh(repo)[1] == 1
        conn = Connection(repo, "origin")
        try:
            assert key not in conn.catalogue.pack_ids()  # its damaged trailer: not relied on
            assert not conn.catalogue.chunks(ids, complete=False)
        finally:
            conn.close()
    finally:
        repo.close()
