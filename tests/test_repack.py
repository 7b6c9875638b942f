"""repack: compressed and delta records in a real repository, and what reads, fsck and gc make of them."""

import dataclasses
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

import mvc
from mvc import ondisk
from mvc.store import codec
from damage import flip_bit

CHUNK = 4096
DTYPES = [torch.bfloat16, torch.float16, torch.float32, torch.float64, torch.int32, torch.int64, torch.uint8,
          torch.bool, torch.float8_e4m3fn, torch.complex64]


@pytest.fixture
def big(tmp_path):
    r = mvc.Repository.init(tmp_path / "r", chunk_size=CHUNK)
    yield r
    r.close()


def _tensor(dtype, n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.rand(n, generator=g) > 0.9
    if not dtype.is_floating_point and not dtype.is_complex:
        return torch.randint(0, 50, (n,), generator=g).to(dtype)
    if dtype == torch.float8_e4m3fn:
        return (torch.randn(n, generator=g) * 0.1).to(dtype)
    return (torch.randn(n, generator=g, dtype=torch.float32) * 0.02).to(dtype)


def _sizes(dtype) -> list:
    per = CHUNK // torch.empty(0, dtype=dtype).element_size()
    return [0, 1, per - 1, per, per + 1, 5 * per + 3]


def _history(repo, steps: int = 3) -> list:
    """(commit id, state) of a run where each step changes a few rows of every tensor."""
    state = {f"{str(d).split('.')[-1]}_{n}": _tensor(d, n, i) for i, d in enumerate(DTYPES) for n in _sizes(d)}
    state["emb"] = torch.randn(512, 64) * 0.02
    out = []
    for step in range(steps):
        state = {k: v.clone() for k, v in state.items()}
        for k, v in state.items():
            if v.numel() > 10:
                v[step * 3 % v.numel()] = _tensor(v.dtype, 1, 100 + step)[0]
        state["emb"][torch.tensor([3, 200, 401]) + step] += 0.5
        out.append((repo.commit(state, f"step {step}").id, state))
    return out


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k].view(torch.uint8) if a[k].numel() else a[k],
                                                    b[k].view(torch.uint8) if b[k].numel() else b[k])
                                        and a[k].dtype == b[k].dtype and a[k].shape == b[k].shape for k in a)


def _kinds(repo) -> dict:
    with repo.index.read() as txn:
        return {cid: loc for cid, loc in txn.chunks()}


def test_every_dtype_and_size_round_trips_bit_for_bit(big):
    history = _history(big)
    report = big.repack()
    assert report.grouped > 0 and report.deltas > 0
    kinds = {loc.kind for loc in _kinds(big).values()}
    assert codec.GROUPED in kinds and codec.DELTA in kinds
    for cid, state in history:
        assert _same(big.load(cid), state)
    assert big.fsck().ok
    assert "encoded-records" in (big.dir / "FORMAT").read_text()


def test_reopened_and_rebuilt_index_keep_the_encodings(big):
    history = _history(big)
    big.repack()
    before = _kinds(big)
    mvc.fsck.rebuild_index(big)
    assert _kinds(big) == before
    again = mvc.Repository.open(big.root)
    for cid, state in history:
        assert _same(again.load(cid), state)
    again.close()


def test_depth_is_bounded(big):
    history = _history(big, steps=5)
    big.repack(depth=2)
    locs = _kinds(big).values()
    assert max(loc.depth for loc in locs) == 2
    for cid, state in history:
        assert _same(big.load(cid), state)


def test_new_commits_after_repack_and_a_second_repack(big):
    history = _history(big, steps=2)
    big.repack()
    history += _history(big, steps=2)
    big.repack()
    for cid, state in history:
        assert _same(big.load(cid), state)
    assert big.fsck().ok


def test_incompressible_data_costs_at_most_1001_per_mille(tmp_path):
    r = mvc.Repository.init(tmp_path / "r")  # the default chunk size
    data = torch.frombuffer(bytearray(os.urandom(4 << 20)), dtype=torch.uint8)
    c = r.commit({"x": data}).id
    report = r.repack()
    assert report.raw == report.chunks and report.bytes_after == report.bytes_before
    pack_bytes = r.status().pack_bytes
    assert pack_bytes <= 1.001 * (4 << 20)
    assert torch.equal(r.load(c)["x"], data)


def _chain(repo, cid: bytes) -> int:
    """Deltas a read of ``cid`` really follows, walking the index."""
    n = 0
    with repo.index.read() as txn:
        at = txn.chunk(cid)
        while at.base is not None:
            n, at = n + 1, txn.chunk(at.base)
    return n


def _repack_after_every_commit(repo, q: torch.Tensor, change) -> dict:
    """Commit ``q`` MAX_DEPTH + 3 times, ``change(q, k)`` before each and a repack after; check every
    record's recorded depth is its real chain, within MAX_DEPTH, and every version loads; the records."""
    history = []
    for k in range(codec.MAX_DEPTH + 3):
        change(q, k)
        history.append((repo.commit({"q": q.clone()}, f"c{k}").id, {"q": q.clone()}))
        repo.repack()
    with repo.index.read() as txn:
        records = {cid: loc for cid, loc in txn.chunks()}
    for cid, loc in records.items():
        assert _chain(repo, cid) == loc.depth <= codec.MAX_DEPTH
    for cid, state in history:
        assert _same(repo.load(cid), state)
    assert repo.fsck().ok
    return records


def test_commit_and_repack_cycles_keep_every_chain_within_its_depth(big):
    # Incompressible bytes (uint8 noise, as a quantized checkpoint) stay raw when grouped, so
    # each repack's tip is raw; the next repack must not make it a delta under older deltas.
    q = torch.randint(0, 256, (CHUNK,), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))

    def flip(q, k):
        q[k * 13] ^= 0x5A
    _repack_after_every_commit(big, q, flip)


def test_commit_and_repack_cycles_store_incompressible_versions_as_deltas_not_whole(big):
    # The raw tip of each repack becomes a delta against the next commit's chunk, its older
    # deltas rewritten one deeper; only when a chain would pass MAX_DEPTH does a version stay
    # whole. MAX_DEPTH + 3 versions fit in 2 chains: 2 whole copies plus deltas of a few bytes
    # each (a repack that kept every base raw stored about every other version whole).
    q = torch.randint(0, 256, (16 * CHUNK,), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    records = _repack_after_every_commit(big, q, lambda q, k: q[k::1024].bitwise_xor_(0x5A))  # every chunk
    assert sum(loc.kind == codec.RAW for loc in records.values()) == 2 * 16
    packs = sum(p.stat().st_size for p in (big.dir / "packs").glob("pack-*.pack"))
    versions = codec.MAX_DEPTH + 3
    assert packs < 2 * q.numel() + versions * q.numel() // 16


def test_a_second_repack_leaves_chunks_that_stay_raw_where_they_are(tmp_path):
    r = mvc.Repository.init(tmp_path / "r", chunk_size=CHUNK)
    data = torch.frombuffer(bytearray(os.urandom(64 * CHUNK)), dtype=torch.uint8)
    c = r.commit({"x": data}).id
    r.repack()
    packs = sorted(p.name for p in (r.dir / "packs").glob("pack-*.pack"))
    report = r.repack()
    assert report.raw == report.chunks == 64 and report.packs_deleted == report.packs_rewritten == 0
    assert sorted(p.name for p in (r.dir / "packs").glob("pack-*.pack")) == packs
    assert torch.equal(r.load(c)["x"], data)
    r.close()


def _record_of(repo, kind: int):
    with repo.index.read() as txn:
        for cid, loc in txn.chunks():
            if loc.kind == kind:
                return cid, loc


def _pack_path(repo, loc):
    return repo.dir / "packs" / f"pack-{loc.pack.hex()}.pack"


@pytest.mark.parametrize("kind", [codec.GROUPED, codec.DELTA])
def test_a_flipped_bit_in_an_encoded_record_is_caught_on_read_and_by_fsck(big, kind):
    history = _history(big)
    big.repack()
    cid, loc = _record_of(big, kind)
    for offset in (loc.offset, loc.offset + loc.length // 2, loc.offset + loc.length - 1):
        flip_bit(_pack_path(big, loc), offset, 3)
        with pytest.raises((mvc.ChecksumMismatch, mvc.CorruptObject)):
            mvc.reader.read_chunk(big, cid)
        broken = [c for c, s in history if cid in {x for e in big.entries(c) if e.kind == "tensor" for x in e.chunks}]
        with pytest.raises((mvc.ChecksumMismatch, mvc.CorruptObject)):
            big.load(broken[0])
        report = big.fsck()
        assert not report.ok
        damage = [d for d in report.damage if cid.hex() in d.chunks]
        assert damage and damage[0].tensors and damage[0].commits
        flip_bit(_pack_path(big, loc), offset, 3)
    assert big.fsck().ok


def test_a_broken_delta_base_is_named_by_tensor_and_commit(big):
    _history(big)
    big.repack()
    cid, loc = _record_of(big, codec.DELTA)
    base = _kinds(big)[loc.base]
    flip_bit(_pack_path(big, base), base.offset + base.length // 2)
    with pytest.raises(mvc.HashMismatch) as err:
        mvc.reader.read_chunk(big, cid)
    assert (err.value.id, err.value.base) == (cid.hex(), loc.base.hex())
    assert err.value.where == f"offset {loc.offset} in {_pack_path(big, loc).name}"
    report = big.fsck()
    mine = [d for d in report.damage if cid.hex() in d.chunks]
    assert mine and mine[0].kind == "broken-delta-base" and mine[0].tensors and mine[0].commits
    of_base = [d for d in report.damage if loc.base.hex() in d.chunks]
    assert of_base and set(mine[0].tensors) <= set(of_base[0].tensors)


def test_gc_keeps_delta_bases_of_kept_commits_alive(big):
    history = _history(big, steps=4)
    big.create_tag("v0", history[0][0])  # kept: its deltas point at chunks of the newer commits gc prunes
    big.repack()
    report = big.gc(keep_last=1, grace=0)
    assert report.pruned
    for cid, state in (history[0], history[-1]):
        assert _same(big.load(cid), state)
    assert big.fsck().ok
    kinds = _kinds(big)
    assert any(loc.kind == codec.DELTA for loc in kinds.values())
    assert all(loc.base in kinds for loc in kinds.values() if loc.base)


def test_gc_rewrite_moves_encoded_records_as_they_are(big):
    _history(big, steps=3)
    big.commit({"junk": torch.randn(200000)}, "junk")  # raw, in the repacked pack: garbage once pruned
    big.repack()
    report = big.gc(keep_last=1, grace=0, branch="main")
    assert report.packs_rewritten == 1 and report.records_moved > 0
    kinds = _kinds(big)
    assert any(loc.coded for loc in kinds.values())
    assert big.fsck().ok


def test_an_older_mvc_refuses_a_repository_with_encoded_records(big, monkeypatch):
    _history(big, steps=1)
    big.repack()
    monkeypatch.setattr(ondisk, "KNOWN_EXTENSIONS", frozenset())
    with pytest.raises(mvc.UnsupportedFormat) as exc:
        mvc.Repository.open(big.root)
    assert exc.value.problem == "extensions" and "encoded-records" in exc.value.extensions


def test_dry_run_changes_nothing(big):
    _history(big, steps=2)
    before = _kinds(big)
    report = big.repack(dry_run=True)
    assert report.dry_run and report.bytes_after < report.bytes_before
    assert _kinds(big) == before and "encoded" not in (big.dir / "FORMAT").read_text()


def test_repack_cli(big):
    from click.testing import CliRunner
    from mvc.cli import main
    _history(big, steps=2)
    os.chdir(big.root)
    result = CliRunner().invoke(main, ["repack"])
    assert result.exit_code == 0 and "byte-grouped" in result.output
    result = CliRunner().invoke(main, ["repack", "--depth", "99"])
    assert result.exit_code == 2


CHILD = r"""
import sys, mvc
repo = mvc.Repository.open(sys.argv[1])
print("start", flush=True)
while True:
    repo.repack()
"""


@pytest.mark.slow
def test_sigkill_during_repack_leaves_fsck_clean(tmp_path):
    repo = mvc.Repository.init(tmp_path / "r", chunk_size=CHUNK)
    history = []
    emb = torch.randn(4096, 64) * 0.02
    for step in range(4):
        emb = emb.clone()
        emb[torch.randint(0, 4096, (20,))] += 1
        history.append((repo.commit({"emb": emb, "w": torch.randn(50000)}).id, emb))
    repo.close()
    for delay in (0.05, 0.2, 0.4, 0.8, 1.5):
        child = subprocess.Popen([sys.executable, "-c", CHILD, str(tmp_path / "r")], stdout=subprocess.PIPE)
        assert child.stdout.readline().startswith(b"start")
        time.sleep(delay)
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        repo = mvc.Repository.open(tmp_path / "r")
        report = repo.fsck()
        assert report.ok, report.damage
        for cid, emb in history:
            assert torch.equal(repo.load(cid)["emb"], emb)
        repo.close()


def test_the_newest_version_is_stored_whole_and_older_ones_as_deltas_against_newer(big):
    history = _history(big, steps=4)
    big.repack()
    kinds = _kinds(big)

    def chunks(cid):
        return [x for e in big.entries(cid) if e.kind == "tensor" for x in e.chunks]
    assert all(kinds[x].kind != codec.DELTA for x in chunks(history[-1][0]))  # the head decodes alone
    second = set(chunks(history[1][0]))
    older = [kinds[x] for x in chunks(history[0][0]) if kinds[x].kind == codec.DELTA]
    assert older and all(loc.base in second for loc in older)
    for cid, state in history:
        assert _same(big.load(cid), state)


def test_a_base_shared_by_several_records_is_decoded_once_per_read(big, monkeypatch):
    from mvc.store import chunks
    same = torch.randn(4 * CHUNK // 4) * 0.02
    head = {"a": same.clone(), "b": same.clone()}  # equal tensors: the same chunk ids
    old = {k: v.clone() for k, v in head.items()}
    old["a"][5] += 1.0
    old["b"][900] += 1.0  # each older chunk differs from the shared head chunk in one element
    first = big.commit(old, "old").id
    big.commit(head, "head")
    big.repack()
    kinds = _kinds(big)
    deltas = {loc.base for e in big.entries(first) if e.kind == "tensor" for x in e.chunks
              for loc in [kinds[x]] if loc.kind == codec.DELTA}
    assert len(deltas) >= 1
    decoded = []
    real = chunks.PackStore.decode

    def counted(self, cid, *args, **kw):
        decoded.append(cid)
        return real(self, cid, *args, **kw)
    monkeypatch.setattr(chunks.PackStore, "decode", counted)
    got = big.load(first)
    assert torch.equal(got["a"], old["a"]) and torch.equal(got["b"], old["b"])
    assert [cid for cid in decoded if cid in deltas]  # the shared base decoded on its own, verified, once
    assert len(decoded) == len(set(decoded))  # and every chunk both tensors hold: once, copied to the other
    decoded.clear()
    got = big.load("HEAD")
    assert torch.equal(got["a"], head["a"]) and torch.equal(got["b"], head["b"])
    assert len(decoded) == len(set(decoded)) == 4  # equal tensors: each chunk decoded once, copied to the other


def test_a_load_reads_only_the_records_it_needs(big, monkeypatch):
    from mvc.store import packs
    history = _history(big, steps=3)
    big.repack()
    kinds = _kinds(big)
    first = history[0][0]
    entries = {e.key: e.chunks for e in big.entries(first) if e.kind == "tensor"}
    needed = set(entries["emb"])
    for cid in list(needed):  # and the bases of its deltas, to the end of each chain
        while kinds[cid].base is not None:
            cid = kinds[cid].base
            needed.add(cid)
    by_place = {(loc.pack, loc.offset): cid for cid, loc in kinds.items()}
    read = []
    real_run = packs.PackReader.read_run

    def run(self, locs, buffers):
        read.extend(by_place[(loc.pack, loc.offset)] for loc in locs)
        return real_run(self, locs, buffers)
    monkeypatch.setattr(packs.PackReader, "read_run", run)
    got = big.load(first, only="emb")
    assert torch.equal(got["emb"], history[0][1]["emb"])
    assert read and set(read) <= needed and len(read) == len(set(read))


def _zstd_plane(repo, loc):
    """The pack offset of the first zstd-compressed plane of the GROUPED record at ``loc``, or None."""
    with open(_pack_path(repo, loc), "rb") as f:
        f.seek(loc.offset)
        payload = f.read(loc.length)
    width, _ = codec.GROUP_HEAD.unpack_from(payload)
    at = codec.GROUP_HEAD.size + width * codec.PLANE_HEAD.size
    for j in range(width):
        mode, n = codec.PLANE_HEAD.unpack_from(payload, codec.GROUP_HEAD.size + j * codec.PLANE_HEAD.size)
        if mode == codec.PLANE_ZSTD:
            return loc.offset + at
        at += n
    return None


def test_a_record_that_does_not_decode_is_lost_and_prune_lost_prunes_its_commits(big):
    """A flipped bit in a compressed plane (the last plane of a grouped record) of a chunk that
    an older commit's delta uses as its base: both the record and the delta above it are lost;
    --prune-lost prunes exactly the commits that hold them, and fsck is clean afterwards."""
    history = _history(big, steps=2)
    big.repack()
    kinds = _kinds(big)
    bases = {loc.base for loc in kinds.values() if loc.kind == codec.DELTA}
    cid, loc = next((c, x) for c, x in kinds.items() if x.kind == codec.GROUPED and c in bases
                    and _zstd_plane(big, x) is not None)
    flip_bit(_pack_path(big, loc), _zstd_plane(big, loc))  # its zstd frame's magic number
    report = big.fsck()
    kinds = {d.kind for d in report.lost}
    assert "bad-encoding" in kinds and kinds <= {"bad-encoding", "broken-delta-base"}
    lost = {c for d in report.lost for c in d.commits}
    assert lost == {c for c, _ in history}  # the head holds the record, the older commit its delta
    assert mvc.fsck.prune_lost(big) == tuple(sorted(lost))
    assert big.fsck().ok


def test_a_base_that_does_not_decode_is_blamed_not_the_deltas_above_it(big):
    """The newest version's record (a zstd plane flipped) is the base of older deltas: a read of
    an older version names that base, and fsck calls only the base's record undecodable."""
    history = _history(big, steps=3)
    big.repack()
    kinds = _kinds(big)
    bases = {loc.base for loc in kinds.values() if loc.kind == codec.DELTA}
    base, loc = next((c, x) for c, x in kinds.items() if x.kind == codec.GROUPED and c in bases
                     and _zstd_plane(big, x) is not None)
    flip_bit(_pack_path(big, loc), _zstd_plane(big, loc))
    above = [c for c, x in kinds.items() if x.base == base]
    with pytest.raises(mvc.CorruptObject) as err:
        mvc.reader.read_chunk(big, above[0])
    assert (err.value.id, getattr(err.value, "base", None)) == (above[0].hex(), base.hex())
    assert isinstance(err.value, mvc.errors.BadEncoding)
    assert err.value.where == f"offset {loc.offset} in {_pack_path(big, loc).name}"
    with pytest.raises(mvc.CorruptObject) as err:  # a load shares decoded bases between records
        big.load(history[0][0])
    assert getattr(err.value, "base", None) == base.hex()
    report = big.fsck()
    assert [d.chunks for d in report.damage if d.kind == "bad-encoding"] == [(base.hex(),)]
    assert {c for d in report.damage if d.kind == "broken-delta-base" for c in d.chunks} >= {c.hex() for c in above}


def _deleted_packs_open(repo) -> list:
    """This process's descriptors of files in ``repo``'s packs folder that are deleted."""
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(str(repo.dir / "packs")) and target.endswith("(deleted)"):
            out.append(target)
    return out


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc")
def test_a_long_lived_reader_lets_go_of_packs_another_process_repacked_away(tmp_path):
    repo = mvc.Repository.init(tmp_path / "r", chunk_size=CHUNK)
    try:
        history = _history(repo, steps=3)
        for cid, state in history:  # descriptors of every pack cached
            assert _same(repo.load(cid), state)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
        done = subprocess.run([sys.executable, "-m", "mvc", "repack"], cwd=repo.root, env=env,
                              capture_output=True, text=True)
        assert done.returncode == 0, done.stdout + done.stderr
        assert _deleted_packs_open(repo)  # the old packs, deleted there, still held here
        for cid, state in history:  # the chunks moved to the repacked pack
            assert _same(repo.load(cid), state)
        assert _deleted_packs_open(repo) == []  # their space is free now, not at exit
    finally:
        repo.close()


def test_repack_counts_a_bases_chain_and_trusts_no_recorded_depth(tmp_path):
    """An index rebuilt from the packs of interrupted repacks can record a delta shallower than its
    chain; a repack that took that depth as true would write a chain past MAX_DEPTH."""
    r = mvc.Repository.init(tmp_path / "r", chunk_size=CHUNK)
    q = torch.frombuffer(bytearray(os.urandom(CHUNK)), dtype=torch.uint8).clone()
    history = []
    for k in range(codec.MAX_DEPTH + 2):  # P, then c0 .. c8: one chunk each, a few bytes apart
        q[k * 7] ^= 0x5A
        history.append((r.commit({"q": q.clone()}, f"v{k}").id, {"q": q.clone()}))
    r.repack()  # c8 whole, c7 .. c0 deltas of depth 1 .. 8; P stays whole (its base c0 is at 8)
    c0 = r.entries(history[1][0])[0].chunks[0]
    with r.index.write() as txn:
        loc = txn.chunk(c0)
        assert loc.depth == codec.MAX_DEPTH
        txn.put_chunk(c0, dataclasses.replace(loc, depth=1), overwrite=True)  # as a mixed rebuild leaves it
    r.repack()
    for cid, state in history:
        assert _same(r.load(cid), state)
    with r.index.read() as txn:
        assert all(_chain(r, cid) <= codec.MAX_DEPTH for cid, _ in txn.chunks())
    r.close()


def _dropped_branch(root) -> tuple:
    """A repository at ``root`` whose deleted branch ``x`` alone held tensor ``b``
    (its commit unreachable: no ref or reflog names it); main holds an encodable tensor,
    so a repack writes a pack and deletes the old ones. Returns (repo, b, the commit on x)."""
    repo = mvc.Repository.init(root, chunk_size=CHUNK)
    repo.commit({"a": torch.zeros(2000)}, "base")
    b = torch.randn(3000, generator=torch.Generator().manual_seed(5)) * 0.02
    on_x = repo.commit({"a": torch.zeros(2000), "b": b}, "on x", branch="x", start="HEAD").id
    repo.delete_branch("x", force=True)
    repo.reflog.expire("x")  # a deleted branch's reflog keeps its tip until expired (or gc's grace passes)
    return repo, b, on_x


def _commit_b_again_and_check(repo, b) -> None:
    """The bytes only the dropped branch held, committed again on main, load bit for bit."""
    c = repo.commit({"a": torch.zeros(2000), "b": b}, "b again on main")
    assert torch.equal(repo.load(c.id)["b"], b)
    report = repo.fsck()
    assert report.ok, report.damage


def test_a_commit_after_repack_dropped_a_deleted_branchs_packs_writes_its_bytes_again(tmp_path):
    """Issue 39.1: repack deleted the packs only the deleted branch used but left their index
    entries, so a commit of the same bytes deduplicated against them and was stored without data."""
    repo, b, _ = _dropped_branch(tmp_path / "r")
    try:
        report = repo.repack()
        assert report.packs_deleted >= 1
        with repo.index.read() as txn:
            named = {loc.pack for _, loc in txn.chunks()}
        on_disk = {f.pack for f in repo.chunks.pack_files()}
        assert named <= on_disk  # the index and the packs agree as soon as repack returns
        _commit_b_again_and_check(repo, b)
    finally:
        repo.close()


def test_a_commit_writes_a_chunk_whose_indexed_pack_is_gone(tmp_path):
    """Defence in depth (issue 39.1): an index entry that names a deleted pack (an older mvc's
    repack left it) is no reason to skip writing the bytes; the new record replaces the entry."""
    repo, b, on_x = _dropped_branch(tmp_path / "r")
    try:
        chunks = next(e.chunks for e in repo.entries(on_x) if e.path == ("b",))
        with repo.index.read() as txn:
            packs = {txn.chunk(cid).pack for cid in chunks}
        for f in repo.chunks.pack_files():
            if f.pack in packs:
                os.unlink(f.path)  # as the old repack did, leaving the entries behind
        _commit_b_again_and_check(repo, b)
    finally:
        repo.close()


KILLED_REPACK = r"""
import os, sys, time, mvc
from mvc.store import index
phase = sys.argv[2]

def stop(*args):
    print("in", phase, flush=True)
    time.sleep(60)

if phase == "drop":  # inside the index transaction that drops the dead entries
    deleting = index.Txn.delete_chunk
    index.Txn.delete_chunk = lambda txn, cid: (stop(), deleting(txn, cid))
else:  # after that transaction committed, before the first pack is deleted
    unlink = os.unlink
    os.unlink = lambda path, *a, **k: (str(path).endswith(".pack") and stop(), unlink(path, *a, **k))
repo = mvc.Repository.open(sys.argv[1])
repo.repack()
print("finished", flush=True)
"""


@pytest.mark.parametrize("phase", ["drop", "unlink"])
def test_repack_killed_between_its_index_write_and_its_unlinks_loses_nothing(tmp_path, phase):
    repo, b, _ = _dropped_branch(tmp_path / "r")
    repo.close()
    child = subprocess.Popen([sys.executable, "-c", KILLED_REPACK, str(tmp_path / "r"), phase],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().split() == ["in", phase]
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
    repo = mvc.Repository.open(tmp_path / "r")
    try:
        _commit_b_again_and_check(repo, b)
        repo.gc(grace=0)  # reclaims what the killed repack left
        assert repo.fsck().unreferenced == ()
        assert torch.equal(repo.load("main")["b"], b)
        repo.repack()
        _commit_b_again_and_check(repo, b)
    finally:
        repo.close()


def test_a_fetch_after_repack_fetches_the_chunks_of_a_deleted_branchs_tensor(tmp_path):
    # repack dropped the chunk entries of a deleted branch but kept its tensor objects: a fetch of
    # a commit holding the same tensor took it as held, fetched none of its chunks, and the
    # fetched branch could not be loaded (found by the soak test)
    def mask(i):
        m = torch.zeros(64, dtype=torch.uint8)
        m[i] = 1
        return {"m": m}
    a = mvc.Repository.init(tmp_path / "a", chunk_size=64)
    a.remotes.add("fold", str(tmp_path / "fold"))
    a.commit(mask(0), "c1")
    a.remotes.push("fold")
    b = mvc.Repository.clone(str(tmp_path / "fold"), tmp_path / "b")
    b.commit(mask(1), "x", branch="x")
    b.delete_branch("x", force=True)
    b.reflog.expire(older_than=0)
    b.repack()
    a.commit(mask(1), "the same bytes on main")
    a.remotes.push("fold")
    b.remotes.fetch()
    assert b.fsck().ok
    assert torch.equal(b.load("origin/main")["m"], mask(1)["m"])
    a.close()
    b.close()


@pytest.mark.parametrize("scale, deltas", [(1e-2, 16), (0.3, 0)])
def test_a_tensor_takes_deltas_where_they_save_enough_of_its_bytes_together(tmp_path, scale, deltas):
    # dense training moves every weight a little: XOR against the next checkpoint saves about a
    # sixth of each chunk, never a half (the per-chunk rule), yet a sixth of a model is worth a
    # decode when an older version is read; a large move saves almost nothing and stays grouped
    repo = mvc.Repository.init(tmp_path, chunk_size=4096)
    g = torch.Generator().manual_seed(0)
    old = torch.randn(16, 1024, generator=g)
    new = old + scale * torch.randn(16, 1024, generator=g)
    first, second = repo.commit({"w": old}), repo.commit({"w": new})
    rows = [(a.numpy().view("uint8"), b.numpy().view("uint8")) for a, b in zip(old, new)]
    assert all(codec.encode(a, 4, b, bytes(32))[0] != codec.DELTA for a, b in rows)  # no delta halves a chunk
    report = repo.repack()
    assert (report.deltas, report.grouped) == (deltas, 32 - deltas)
    assert torch.equal(repo.load(first.id)["w"], old) and torch.equal(repo.load(second.id)["w"], new)
    assert repo.fsck().ok
    repo.close()
