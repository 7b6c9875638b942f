"""Audit exports, scheduled integrity scans and signing policy on remotes (mvc/audit.py)."""

import json
import math
import random

import pytest
import torch

import mvc
from mvc import signing
from mvc.errors import BadInput, HistoryRewritten, ScanFoundDamage, SignatureRequired

from conftest import run_cli
from damage import flip_bit, records

ALICE = signing.key_from_seed(bytes(range(32, 64)))
MALLORY = signing.key_from_seed(b"\x07" * 32)


def allow(repo, tmp_path, *keys) -> None:
    path = tmp_path / "allowed_signers"
    path.write_text("".join(f"user{i}@example.com {k.public_line()}\n" for i, k in enumerate(keys)))
    repo.config(signing.ALLOWED, str(path))


def tensor(seed: int, n: int = 96) -> torch.Tensor:
    return torch.randn(n, generator=torch.Generator().manual_seed(seed))


# -- audit ------------------------------------------------------------------------------

def test_audit_chain_back_to_the_root(repo, tmp_path):
    allow(repo, tmp_path, ALICE)
    a = repo.commit({"w": tensor(0)}, "root", step=1, metrics={"loss": 2.0},
                    context={"lr": 0.1, "code": {"git_commit": "abc123"}, "big": {"x": [1, 2]}}, sign=ALICE)
    b = repo.commit({"w": tensor(1)}, "unsigned", step=2)
    c = repo.commit({"w": tensor(2)}, "deployed", step=3, sign=MALLORY)
    report = repo.trust.audit("HEAD")
    assert [e.id for e in report.commits] == [c.id, b.id, a.id]
    assert report.roots == (a.id,) and report.id == c.id
    assert [e.signature.status for e in report.commits] == ["unknown", "unsigned", "good"]
    root = report.commits[-1]
    assert root.highlights == {"lr": 0.1, "code.git_commit": "abc123"} and root.metrics == {"loss": 2.0}
    assert report.commits[0].parents == (b.id,) and root.parents == ()
    assert not report.ok and report.counts == {"good": 1, "bad": 0, "unknown": 1, "unsigned": 1}
    r = run_cli(repo, "audit", "--json")
    out = json.loads(r.output)
    assert r.exit_code == 1 and [x["id"] for x in out["commits"]] == [c.id, b.id, a.id]
    assert out["commits"][2]["signature"]["principal"] == "user0@example.com"
    assert out["commits"][2]["signature"]["good"] is True and out["commits"][2]["time_utc"].endswith("Z")
    r = run_cli(repo, "audit", a.id)
    assert r.exit_code == 0 and "1 good, 0 bad" in r.output and "code.git_commit = abc123" in r.output
    # --objects: what a reviewer checks with b3sum and ssh-keygen, without mvc
    entry = json.loads(run_cli(repo, "audit", "--json", "--objects", a.id).output)["commits"][0]
    assert mvc.hashing.digest(bytes.fromhex(entry["encoding"])).hex() == a.id
    blob = signing.dearmor(entry["sshsig"])
    assert signing.verify(blob, bytes.fromhex(entry["payload"]), signing.parse_allowed_signers(
        f"x {ALICE.public_line()}")).good
    assert "payload" not in json.loads(run_cli(repo, "audit", "--json").output)["commits"][0]


def test_audit_marks_a_damaged_commit_bad_and_stops_there(repo, tmp_path):
    allow(repo, tmp_path, ALICE)
    repo.commit({"w": tensor(0)}, sign=ALICE)
    b = repo.commit({"w": tensor(1)}, sign=ALICE)
    c = repo.commit({"w": tensor(2)}, sign=ALICE)
    oid = bytes.fromhex(b.id)
    with repo.index.write() as txn:
        data = bytearray(txn.get("commits", oid))
        data[-3] ^= 1
        txn.delete("commits", oid)
        txn.put("commits", oid, bytes(data))
    report = repo.trust.audit()
    assert [(e.id, e.signature.status) for e in report.commits] == [(c.id, "good"), (b.id, "bad")]
    assert "hash" in report.commits[1].signature.reason and report.roots == ()


# -- scheduled scans ------------------------------------------------------------------------

def history(repo, n: int = 8) -> None:
    for i in range(n):
        repo.commit({"w": tensor(i, 64 + 16 * i), "b": torch.full((5,), float(i))}, f"c{i}")


@pytest.mark.parametrize("budget", ["25%", "10%", "34%"])
def test_a_flipped_byte_is_found_within_the_promised_runs(repo, budget):
    history(repo)
    rng = random.Random(budget)
    recs = records(repo)
    total = sum(n for *_, n in recs)
    share = float(budget[:-1]) / 100
    biggest = max(n for *_, n in recs)
    for trial in range(4):
        for _ in range(rng.randrange(5)):  # the cursor anywhere
            repo.trust.scan(budget)
        path, cid, off, n = rng.choice(recs)
        at, bit = off + rng.randrange(n), rng.randrange(8)
        flip_bit(path, at, bit)
        try:
            runs, found = 0, None
            promise = None
            while found is None:
                report = repo.trust.scan(budget)
                runs += 1
                promise = report.runs_to_cover
                assert report.bytes_total == total
                # the budget, rounded up to whole records
                assert math.ceil(total * share) <= report.bytes_verified < math.ceil(total * share) + biggest
                if not report.ok:
                    found = report
                assert runs <= promise, f"not found within {promise} runs"
            assert promise == math.ceil(1 / share - 1e-9)
            assert [(p.chunk, p.kind) for p in found.problems] == [(cid.hex(), "checksum-mismatch")]
            assert found.problems[0].pack == path.name
            with pytest.raises(ScanFoundDamage) as info:
                mvc.audit.raise_for(found)
            assert info.value.problems[0][:2] == (path.name, cid.hex())
        finally:
            flip_bit(path, at, bit)
    assert repo.fsck().ok


def test_scan_rotates_and_remembers_where_it_stopped(repo):
    history(repo, 4)
    total = repo.trust.scan("100%")
    assert total.ok and total.bytes_verified == total.bytes_total and total.wrapped
    seen = 0
    for _ in range(4):  # four quarters cover everything, each starting where the last stopped
        seen += mvc.Repository.open(repo.root).trust.scan("25%").bytes_verified
    assert seen >= total.bytes_total
    (repo.dir / "scan-state").write_text("{damaged")
    assert repo.trust.scan("25%").ok  # derived state: it starts over
    for bad in ("0%", "150%", "soon", "-3s", 0):
        with pytest.raises(BadInput):
            repo.trust.scan(bad)
    assert repo.trust.scan("5s").records == len(records(repo))  # a small repository fits any time budget


def test_a_damaged_trailer_is_reported_by_every_run(repo):
    history(repo, 3)
    path = records(repo)[0][0]
    flip_bit(path, path.stat().st_size - 60)
    for _ in range(3):
        report = repo.trust.scan("10%")
        assert [(p.pack, p.kind) for p in report.problems if p.chunk is None] == [(path.name, "damaged-pack")]


def test_a_scan_of_a_repacked_repository_finds_no_damage_in_any_slice(tmp_path):
    """Slices of the ring cut between a delta record and its base: the base is found through the
    index, not reported broken (a budgeted scan said 'broken-delta-base' on a healthy repository)."""
    repo = mvc.Repository.init(tmp_path / "r", chunk_size=1024)  # deltas pay from about here
    g = torch.Generator().manual_seed(0)
    s = {"w": torch.randn(16384, generator=g), "b": torch.randn(4096, generator=g).to(torch.bfloat16), "step": 0}
    for i in range(5):
        s = {"w": s["w"].clone(), "b": s["b"].clone(), "step": i}
        s["w"][i * 3] += 1.0  # a few values: repack stores the older versions as deltas
        repo.commit(s, f"c{i}")
    assert repo.repack().deltas > 0 and repo.fsck().ok
    reports = [mvc.Repository.open(repo.root).trust.scan("10%") for _ in range(12)]
    assert any(r.wrapped for r in reports)
    assert all(r.ok for r in reports), [p for r in reports for p in r.problems]
    repo.close()


def test_a_scan_after_repack_and_gc_passes_over_garbage_and_still_finds_live_damage(tmp_path):
    """gc keeps a mostly-live pack whole: the pruned commits' delta records stay in it as garbage,
    their bases' index entries gone. The scan judged them and said 'broken-delta-base' while fsck
    said ok (and a Checkpointer's scan stopped training); it passes over them now, not even a
    flipped bit in one is damage, while every live record is still verified."""
    repo = mvc.Repository.init(tmp_path / "r", chunk_size=4096)
    g = torch.Generator().manual_seed(0)
    frozen = torch.randn(64 * 1024, generator=g)  # the same in every commit: the pack stays mostly live
    ws = [torch.randn(1024, generator=g) for _ in range(12)]
    for k in range(4):
        for w in ws:
            w[k] += 1
        repo.commit({"frozen": frozen, **{f"w{i}": w.clone() for i, w in enumerate(ws)}}, f"c{k}")
    assert repo.repack().deltas > 0
    assert repo.gc(keep_last=2, expire_reflog=0, grace=0).pruned  # c2 stays, as deltas on c3
    fsck = repo.fsck()
    assert fsck.ok and any(u.kind == "unused-records" for u in fsck.unreferenced)
    with repo.index.read() as txn:
        garbage = [(path, cid, off, n) for path, cid, off, n in records(repo)
                   if (txn.chunk(cid) is None or txn.chunk(cid).offset != off)]
        kinds = {txn.chunk(cid).kind for _, cid, _, _ in records(repo) if txn.chunk(cid) is not None}
    assert garbage and 2 in kinds  # deltas among the live records too
    path, _, off, n = garbage[0]
    flip_bit(path, off + n // 2)  # damage in garbage is harmless
    live = sum(n for *_, n in records(repo)) - sum(n for *_, n in garbage)
    reports = []
    while not (reports and reports[-1].wrapped):
        reports.append(repo.trust.scan("5%"))
    assert all(r.ok for r in reports), [p for r in reports for p in r.problems]
    assert sum(r.unused for r in reports) == len(garbage)
    assert sum(r.bytes_verified for r in reports) >= live  # every live byte verified in one lap
    _, cid, off, n = next(x for x in records(repo) if x not in garbage and x[0] == path)
    flip_bit(path, off + n // 2)  # a live record of the same pack: found within the promise
    found = [repo.trust.scan("5%") for _ in range(reports[0].runs_to_cover)]
    assert cid.hex() in {p.chunk for r in found for p in r.problems}
    repo.close()


def test_fsck_budget_cli(repo):
    history(repo, 3)
    r = run_cli(repo, "fsck", "--budget", "50%")
    assert r.exit_code == 0 and "any 2 consecutive runs" in r.output
    path, cid, off, n = records(repo)[0]
    flip_bit(path, off)
    codes = [run_cli(repo, "fsck", "--budget", "50%", "--json") for _ in range(2)]
    assert any(c.exit_code == 1 and json.loads(c.output)["problems"][0]["chunk"] == cid.hex() for c in codes)
    assert run_cli(repo, "fsck", "--budget", "lots").exit_code == 1
    r = run_cli(repo, "fsck", "--budget", "10%", "--rebuild-index")  # would look done, and not be
    assert r.exit_code == 2 and "does not go with --rebuild-index" in r.output


def test_checkpointer_scan_raises_damage_at_the_next_step(tmp_path, caplog):
    from mvc_hooks import Checkpointer
    model = torch.nn.Linear(8, 8)
    repo = mvc.Repository.init(tmp_path, chunk_size=64)
    allow(repo, tmp_path, ALICE)
    with pytest.raises(BadInput):
        Checkpointer(tmp_path, model=model, scan="often")
    ckpt = Checkpointer(tmp_path, model=model, every_n_steps=1, async_save=False, scan="50%", sign=ALICE)
    try:
        for step in range(3):
            ckpt.step(step, loss=1.0)
            ckpt._scan.join()
        path, cid, off, n = records(repo)[0]
        flip_bit(path, off + 1)
        with pytest.raises(ScanFoundDamage) as info:
            for step in range(3, 3 + 2 * 2 + 1):  # a commit starts a scan; two scans cover everything
                with torch.no_grad():
                    model.weight.add_(1.0)
                ckpt.step(step, loss=1.0)
                ckpt._scan.join()
        assert info.value.problems[0][1] == cid.hex()
        assert "integrity scan found damage" in caplog.text
        flip_bit(path, off + 1)
    finally:
        ckpt.close()
    assert repo.trust.audit("HEAD").ok  # every commit the run made is signed by an allowed signer


# -- policy on remotes (the real S3 server) ------------------------------------------------

@pytest.fixture
def remote_pair(tmp_path, s3_server, s3_url):
    """(writer, reader): two repositories with the same policy (main requires signatures
    from ALICE), sharing S3 remote origin."""
    url = s3_url("signed")
    writer = mvc.Repository.init(tmp_path / "w", chunk_size=256)
    reader_dir = tmp_path / "r"
    for repo in (writer,):
        allow(repo, tmp_path, ALICE)
    writer.commit({"w": tensor(0)}, "root", sign=ALICE)
    writer.remotes.add("origin", url, s3_server.endpoint)
    writer.config(signing.REQUIRE, "main")
    writer.remotes.push()
    reader = mvc.Repository.clone(url, reader_dir, endpoint_url=s3_server.endpoint)
    allow(reader, tmp_path, ALICE)
    reader.config(signing.REQUIRE, "main")
    yield writer, reader
    writer.close()
    reader.close()


def remote_keys(s3_server, repo) -> set:
    bucket, _, prefix = repo.remotes.list()[0].url[len("s3://"):].partition("/")
    listing = s3_server.client().list_objects_v2(Bucket=bucket, Prefix=prefix + "/")
    return {o["Key"] for o in listing.get("Contents", [])}


def test_push_refuses_unsigned_and_unknown_history_to_a_protected_ref(remote_pair, s3_server):
    writer, reader = remote_pair
    tip = writer.resolve("main")
    writer.config(signing.REQUIRE, "release")  # a local commit is allowed, then the push is checked
    unsigned = writer.commit({"w": tensor(1)}, "unsigned")
    signed = writer.commit({"w": tensor(2)}, "signed on top", sign=ALICE)
    writer.config(signing.REQUIRE, "main")
    before = remote_keys(s3_server, writer)
    with pytest.raises(SignatureRequired) as info:
        writer.remotes.push(force=True)
    assert (info.value.ref, info.value.id, info.value.status) == ("heads/main", unsigned.id, "unsigned")
    assert remote_keys(s3_server, writer) == before  # refused before anything was uploaded
    writer.config(signing.REQUIRE, "release")  # local moves are checked too: make the history first
    writer.create_branch("main", unsigned.parents[0], force=True)
    writer.commit({"w": tensor(3)}, "mallory", sign=MALLORY)
    writer.config(signing.REQUIRE, "main")
    with pytest.raises(SignatureRequired) as info:
        writer.remotes.push()
    assert info.value.status == "unknown"
    assert reader.remotes.fetch().refs == () or reader.resolve("origin/main") == tip  # nothing moved on the remote
    writer.config(signing.REQUIRE, "release")
    good = writer.create_branch("main", tip, force=True)
    writer.config(signing.REQUIRE, "main")
    c = writer.commit({"w": tensor(4)}, "good", sign=ALICE)
    writer.remotes.push()
    reader.remotes.fetch()
    assert reader.resolve("origin/main") == c.id and good.id == tip and signed.id != c.id


def test_a_rewrite_of_a_protected_ref_is_refused_by_push_and_fetch_and_shown_by_fsck(remote_pair, tmp_path,
                                                                                  s3_server):
    writer, reader = remote_pair
    root = writer.resolve("main")
    writer.commit({"w": tensor(5)}, "one", sign=ALICE)
    writer.remotes.push()
    reader.remotes.fetch()
    # another writer without the policy rewrites main to a history of its own, signed by ALICE
    rogue = mvc.Repository.clone(writer.remotes.list()[0].url, tmp_path / "rogue", endpoint_url=s3_server.endpoint)
    rogue.create_branch("main", root, force=True)
    rewritten = rogue.commit({"w": tensor(6)}, "rewritten", sign=ALICE)
    rogue.remotes.push(force=True)
    writer.config(signing.REQUIRE, "release")  # local moves are checked too: make the history first
    writer.create_branch("main", root, force=True)
    writer.commit({"w": tensor(7)}, "mine", sign=ALICE)
    writer.config(signing.REQUIRE, "main")
    with pytest.raises(HistoryRewritten) as info:  # the protected side refuses even with force
        writer.remotes.push(force=True)
    assert info.value.ref == "heads/main"
    with pytest.raises(HistoryRewritten) as info:
        reader.remotes.fetch()
    assert info.value.new == rewritten.id
    assert reader.resolve("origin/main") != rewritten.id  # nothing was taken in
    report = reader.remotes.fsck()
    assert [(p.kind, p.object) for p in report.problems] == [("rewritten-protected-ref", "refs/heads/main")]
    reader.config(signing.FETCH, "flag")  # flagged, not refused
    assert [(u.ref, u.new) for u in reader.remotes.fetch().refs] == [("remotes/origin/main", rewritten.id)]
    assert reader.resolve("origin/main") == rewritten.id
    rogue.close()


def test_a_signed_tag_pushes_its_ref_and_its_signature_stays_local(remote_pair):
    """As the README says: the tag's ref travels, its tag object does not, so a clone
    verifies the commit's own signature (which travels in the commit) and finds the tag unsigned."""
    writer, reader = remote_pair
    c = writer.commit({"w": tensor(9)}, "release", sign=ALICE)
    writer.create_tag("v1", c.id, sign=ALICE, message="release 1")
    assert writer.trust.verify_tag("v1").good
    writer.remotes.push(refs=("main", "v1"))
    reader.remotes.fetch()
    assert reader.resolve("v1") == c.id
    assert reader.trust.verify_commit("v1").good
    assert reader.trust.verify_tag("v1").status == "unsigned"


def test_fetch_refuses_a_forged_history(remote_pair, tmp_path, s3_server):
    writer, reader = remote_pair
    rogue = mvc.Repository.clone(writer.remotes.list()[0].url, tmp_path / "rogue", endpoint_url=s3_server.endpoint)
    forged = rogue.commit({"w": tensor(8)}, "looks like alice's", author=writer.get_commit().author, sign=MALLORY)
    rogue.remotes.push()
    with pytest.raises(SignatureRequired) as info:
        reader.remotes.fetch()
    assert (info.value.id, info.value.status) == (forged.id, "unknown")
    with pytest.raises(mvc.UnknownRevision):
        reader.get_commit(forged.id)  # refused before anything was stored
    rogue.close()


def test_fsck_remote_read_subset_finds_a_flipped_byte_in_exactly_its_group(tmp_path, s3_server, s3_url):
    url = s3_url("subset")
    repo = mvc.Repository.init(tmp_path / "a", chunk_size=256)
    repo.remotes.add("origin", url, s3_server.endpoint)
    for i in range(4):  # one chunk pack per push
        repo.commit({"w": tensor(i, 512)}, f"c{i}")
        repo.remotes.push()
    bucket, _, prefix = url[len("s3://"):].partition("/")
    client = s3_server.client()
    keys = [o["Key"] for o in client.list_objects_v2(Bucket=bucket, Prefix=f"{prefix}/packs/")["Contents"]]
    assert len(keys) >= 4
    data = bytearray(client.get_object(Bucket=bucket, Key=keys[0])["Body"].read())
    data[8 + 36 + 10] ^= 0x10  # inside the first record's bytes
    client.put_object(Bucket=bucket, Key=keys[0], Body=bytes(data))
    groups = 3
    found = []
    for n in range(1, groups + 1):
        report = repo.remotes.fsck(read_subset=f"{n}/{groups}")
        outside = sum(1 for k in keys if bytes.fromhex(k.rpartition("/")[2][:-5])[0] % groups != n - 1)
        assert report.subset == f"{n}/{groups}" and report.packs_trusted == outside
        if not report.ok:
            found.append(n)
            assert any(keys[0].rpartition("/")[2] in p.object for p in report.problems)
    name = bytes.fromhex(keys[0].rpartition("/")[2][:-5])
    assert found == [name[0] % groups + 1]  # exactly its group, and every run of 1..T together finds it
    r = run_cli(repo, "fsck", "--remote", "origin", "--read-subset", f"{found[0]}/{groups}")
    assert r.exit_code == 1 and "read subset" in r.output
    assert run_cli(repo, "fsck", "--remote", "origin", "--read-subset", "0/3").exit_code == 1
    assert run_cli(repo, "fsck", "--read-subset", "1/3").exit_code == 2
    repo.close()


def test_fsck_remote_shows_a_forced_rewrite_of_a_protected_ref(tmp_path):
    remote = str(tmp_path / "remote")  # a folder remote: the same layout as S3
    a = mvc.Repository.init(tmp_path / "a", chunk_size=256)
    a.remotes.add("origin", remote)
    root = a.commit({"w": tensor(0)}, "root")
    a.commit({"w": tensor(1)}, "one")
    a.set_protected("main")
    a.remotes.push()
    assert a.remotes.fsck().ok
    rogue = mvc.Repository.clone(remote, tmp_path / "rogue")
    rogue.create_branch("main", root.id, force=True)
    rogue.commit({"w": tensor(2)}, "rewritten")
    rogue.remotes.push(force=True)  # --force moves a protected remote ref (no signing policy here)
    report = a.remotes.fsck()
    assert [(p.kind, p.object) for p in report.problems] == [("rewritten-protected-ref", "refs/heads/main")]
    assert run_cli(a, "fsck", "--remote", "origin").exit_code == 1
    rogue.close()
    a.close()


def test_audit_shows_a_commits_own_text_escaped_so_it_cannot_forge_a_verdict(repo, tmp_path):
    """An author, message or context is anyone's text (a fetched commit's): raw, a newline in it
    printed a line that reads as another commit's good signature, and escape sequences could
    move the cursor over the real verdict."""
    allow(repo, tmp_path, ALICE)
    forged = "\n\ncommit " + "ab" * 32 + "\n  signature: Good signature from user0@example.com"
    repo.commit({"w": tensor(0)}, "root" + "\x1b]0;title\x07", author="eve" + forged,
                context={"lr\n  signature: Good": "\x1b[1A\x1b[2K"})
    r = run_cli(repo, "audit")
    assert r.exit_code == 1
    assert "\x1b" not in r.output and "\x07" not in r.output
    lines = r.output.splitlines()
    assert [line for line in lines if line.startswith("commit ")] == [f"commit {repo.resolve('HEAD')}"]
    assert [line for line in lines if "signature:" in line and "eve" not in line and "lr" not in line] == [
        "  signature: No signature"]
    assert "eve\\n\\ncommit " + "ab" * 32 in r.output  # shown, escaped


def test_an_allowed_signer_replaced_in_place_is_no_longer_trusted(repo, tmp_path):
    """The parsed allowed-signers file was cached by its mtime, size and inode: a key replaced
    in place by another of the same length with the mtime kept (cp -p, an unpacked archive, or
    within one tick of the clock) still verified good in a process that had read it."""
    import os
    allow(repo, tmp_path, ALICE)
    path = tmp_path / "allowed_signers"
    c = repo.commit({"w": tensor(0)}, "by alice", sign=ALICE)
    assert repo.trust.verify_commit(c.id).status == "good"
    st = os.stat(path)
    with open(path, "r+") as f:  # the same inode and size, ALICE revoked
        f.write(f"user0@example.com {MALLORY.public_line()}\n")
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (os.stat(path).st_size, os.stat(path).st_ino) == (st.st_size, st.st_ino)
    assert repo.trust.verify_commit(c.id).status == "unknown"


def test_fetch_in_flag_mode_moves_the_tracking_refs_and_skips_the_tag_the_policy_refuses(tmp_path):
    """With signing.fetch flag, a fetch that brought an unsigned commit under a required tag
    failed whole (the local tag's own policy check refused it) and moved no tracking ref: it
    moves them, leaves the tag out and says so."""
    origin = mvc.Repository.init(tmp_path / "o", chunk_size=256)
    origin.commit({"w": tensor(0)}, "root")
    origin.remotes.add("origin", str(tmp_path / "remote"))
    origin.remotes.push()
    clone = mvc.Repository.clone(str(tmp_path / "remote"), tmp_path / "c")
    clone.config(signing.REQUIRE, "main,tags/*")
    clone.config(signing.FETCH, "flag")
    tip = origin.commit({"w": tensor(1)}, "unsigned").id
    origin.create_tag("v9", tip)
    origin.remotes.push(refs=("main", "v9"))
    report = clone.remotes.fetch()
    assert clone.resolve("origin/main") == tip
    assert "v9" not in {t.name for t in clone.tags()}
    assert [(u.ref, u.new, u.status) for u in report.refs if u.ref == "tags/v9"] == [
        ("tags/v9", tip, mvc.remote.sync.REFUSED)]
    assert sorted((f.ref, f.id, f.status) for f in report.flagged) == [("heads/main", tip, "unsigned"),
                                                                        ("tags/v9", tip, "unsigned")]
    origin.commit({"w": tensor(2)}, "again")
    origin.remotes.push()
    result = run_cli(clone, "fetch", "origin")
    assert result.exit_code == 0, result.output
    assert clone.resolve("origin/main") == origin.resolve("main")
    lines = [line for line in result.output.splitlines() if "v9" in line]
    assert len(lines) == 1 and "signatures" in lines[0], result.output
    clone.config(signing.FETCH, "refuse")
    assert run_cli(clone, "fetch", "origin").exit_code == 1  # refuse mode still refuses
    clone.close()
    origin.close()
