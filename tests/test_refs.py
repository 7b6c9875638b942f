"""Ref names, revision syntax and resolution, branches, tags, protection and checkout."""

import pytest
import torch

import mvc
from mvc import refs
from mvc.errors import (AmbiguousRevision, InvalidRefName, ProtectedRef, RefConflict, UnknownRevision)


@pytest.fixture
def chain(repo):
    """Three commits on main (c1 <- c2 <- c3), tag v1 at c1, branch dev at c2."""
    ids = [repo.commit({"w": torch.full((3,), float(i))}, f"c{i}", step=i).id for i in (1, 2, 3)]
    repo.create_tag("v1", ids[0])
    repo.create_branch("dev", ids[1])
    return ids


# -- names -------------------------------------------------------------------


@pytest.mark.parametrize("name", [
    "main", "feature/x", "release-1.0", "v1.2.3", "a_b", "@foo", "foo@bar", "x.lockx", "über", "a/b/c",
    "a" * 63, "0123",
])
def test_valid_names(name):
    assert refs.check_name(name) == name


@pytest.mark.parametrize("name", [
    "", "HEAD", "@", "foo..bar", "foo bar", "foo\tbar", "foo\x00", "foo\x7f", "foo~1", "foo^", "foo:bar",
    "foo?", "foo*", "foo[", "foo\\bar", ".foo", "foo/.bar", "foo.lock", "foo/bar.lock", "foo.lock/bar",
    "foo/", "/foo", "foo.", "foo//bar", "foo@{1}", "0" * 64, "ab" * 32, None, 5,
])
def test_invalid_names(name):
    with pytest.raises(InvalidRefName):
        refs.check_name(name)


def test_invalid_name_message_says_why():
    with pytest.raises(InvalidRefName) as err:
        refs.check_name("a..b", "branch")
    assert (err.value.name, err.value.problem) == ("a..b", "it holds '..', '@{' or '//'")


@pytest.mark.parametrize("rev, base, ops", [
    ("main", "main", []),
    ("main~", "main", [("~", 1)]),
    ("main~3", "main", [("~", 3)]),
    ("main^", "main", [("^", 1)]),
    ("main^2~10^", "main", [("^", 2), ("~", 10), ("^", 1)]),
    ("HEAD^0", "HEAD", [("^", 0)]),
    ("abcd~x", "abcd~x", []),
])
def test_split_revision(rev, base, ops):
    assert refs.split_revision(rev) == (base, ops)


@pytest.mark.parametrize("rev", ["", "~1", "^", None])
def test_split_revision_refuses_revisions_without_base(rev):
    with pytest.raises(UnknownRevision):
        refs.split_revision(rev)


# -- revisions ---------------------------------------------------------------


def test_revisions_resolve(repo, chain):
    c1, c2, c3 = chain
    cases = {
        c3: c3, c1.upper(): c1, c2[:4]: c2, c2[:9]: c2, "main": c3, "heads/main": c3, "HEAD": c3, "@": c3,
        "v1": c1, "tags/v1": c1, "dev": c2, "main~2": c1, "main~1": c2, "main~0": c3, "main^": c2,
        "main^^": c1, "main^0": c3, "HEAD~1^": c1, "dev^": c1, f"{c3[:6]}~2": c1,
    }
    for rev, expect in cases.items():
        assert repo.resolve(rev) == expect, rev


@pytest.mark.parametrize("rev, asked, reason", [
    ("nope", "nope", "unknown"),
    ("main~3", "main~3", "few-ancestors"),
    ("main~9223372036854775807", "main~9223372036854775807", "few-ancestors"),  # past islice's sys.maxsize
    ("main~" + "9" * 40, "main~" + "9" * 40, "few-ancestors"),
    ("main^9223372036854775807", "main^9223372036854775807", "no-such-parent"),
    ("main^2", "main^2", "no-such-parent"),
    ("v1^", "v1^", "no-parent"),
    ("abc", "abc", "short-prefix"),  # a prefix needs 4 digits
    ("~2", "~2", "malformed"),
    ("0" * 64, "0" * 64, "unknown"),
    ("main@{9}", "main@{9}", "reflog"),
])
def test_bad_revisions(repo, chain, rev, asked, reason):
    with pytest.raises(UnknownRevision) as err:
        repo.resolve(rev)
    assert (err.value.rev, err.value.reason) == (asked, reason)


def test_unborn_head(repo):
    with pytest.raises(UnknownRevision) as err:
        repo.resolve("HEAD")
    assert (err.value.rev, err.value.reason) == ("HEAD", "unborn")
    assert list(repo.log()) == []
    assert repo.head() == mvc.Head("main", None)


def test_a_name_never_means_two_things(repo, chain):
    c1, c2, c3 = chain
    repo.create_tag("same", c1)
    with pytest.raises(mvc.RefConflict):  # a branch would hide the tag (issue 21, finding 9)
        repo.create_branch("same", c2)
    assert repo.resolve("same") == c1
    repo.create_branch(c3[:4], c1)  # a branch named like an id prefix: saying it is ambiguous
    with pytest.raises(mvc.AmbiguousRevision):
        repo.resolve(c3[:4])
    assert repo.resolve("heads/" + c3[:4]) == c1
    assert repo.resolve(c3[:5]) == c3


def forge_commits(repo, ids):
    """Index commit records under chosen ids (test-only: the ids are not the hashes)."""
    with repo.index.write() as txn:
        for oid in ids:
            txn.put("commits", oid, b"forged")


def test_ambiguous_prefix(repo):
    a = bytes.fromhex("abcd01") + b"\x00" * 29
    b = bytes.fromhex("abcd02") + b"\x00" * 29
    c = bytes.fromhex("abce") + b"\x00" * 30
    forge_commits(repo, [a, b, c])
    with pytest.raises(AmbiguousRevision) as err:
        repo.resolve("abcd")
    assert err.value.prefix == "abcd" and sorted(err.value.matches) == sorted([a.hex(), b.hex()])
    with pytest.raises(AmbiguousRevision):
        repo.resolve("ABCD0")  # odd length, either case
    assert repo.resolve("abcd01") == a.hex()
    assert repo.resolve("abcd02") == b.hex()
    assert repo.resolve("abce") == c.hex()
    with pytest.raises(UnknownRevision):
        repo.resolve("abcf")


def test_real_commits_sharing_a_prefix_are_ambiguous(repo):
    """Commit tiny states until two ids share 4 hex digits (about 300 commits on average)."""
    seen = {}
    for i in range(2000):
        oid = repo.commit({"i": i}, "").id
        if oid[:4] in seen:
            break
        seen[oid[:4]] = oid
    else:
        pytest.fail("no two of 2000 commit ids shared a 4-digit prefix")
    with pytest.raises(AmbiguousRevision):
        repo.resolve(oid[:4])
    assert repo.resolve(oid[:12]) == oid


# -- branches and tags -------------------------------------------------------


def test_create_list_delete_branches(repo, chain):
    c1, c2, c3 = chain
    assert [(b.name, b.id) for b in repo.branches()] == [("dev", c2), ("main", c3)]
    with pytest.raises(RefConflict) as err:
        repo.create_branch("dev", c3)
    assert (err.value.ref, err.value.found) == ("heads/dev", c2)
    assert repo.create_branch("dev", c2).id == c2  # same place: nothing to do
    assert repo.create_branch("dev", c3, force=True).id == c3
    repo.delete_branch("dev")
    assert [b.name for b in repo.branches()] == ["main"]
    with pytest.raises(UnknownRevision) as err:
        repo.delete_branch("dev")
    assert (err.value.rev, err.value.reason) == ("heads/dev", "unknown")
    with pytest.raises(InvalidRefName):
        repo.create_branch("bad name")


def test_deleting_the_checked_out_branch_is_refused(repo, chain):
    with pytest.raises(RefConflict) as err:
        repo.delete_branch("main")
    assert err.value.ref == "heads/main" and err.value.found is None
    repo.checkout("dev")
    repo.delete_branch("main", force=True)  # dev does not reach main's tip: -D
    assert [b.name for b in repo.branches()] == ["dev"]


def test_protected_tag(repo, chain):
    c1, c2, c3 = chain
    tag = repo.create_tag("release", c2, protect=True)
    assert tag.protected and tag.id == c2
    with pytest.raises(ProtectedRef) as err:
        repo.create_tag("release", c3)
    assert (err.value.ref, err.value.action) == ("tags/release", "move")
    with pytest.raises(ProtectedRef):
        repo.delete_tag("release")
    moved = repo.create_tag("release", c3, force=True)
    assert moved.id == c3 and moved.protected  # force moves it, protection stays
    assert {t.name: (t.id, t.protected) for t in repo.tags()} == {"release": (c3, True), "v1": (c1, False)}
    repo.delete_tag("release", force=True)
    assert [t.name for t in repo.tags()] == ["v1"]


def test_unprotected_tag_moves_only_with_force(repo, chain):
    c1, c2, _ = chain
    with pytest.raises(RefConflict):
        repo.create_tag("v1", c2)
    assert repo.create_tag("v1", c2, force=True).id == c2
    repo.delete_tag("v1")
    assert repo.tags() == []


def test_protected_branch_refuses_commits(repo, chain):
    repo.set_protected("main", True)
    assert repo.branches()[1].protected
    with pytest.raises(ProtectedRef):
        repo.commit({"w": torch.ones(1)})
    repo.set_protected("main", False)
    assert repo.commit({"w": torch.ones(1)}).parents == (chain[2],)


# -- HEAD ----------------------------------------------------------------------


def test_checkout_branch_and_detached(repo, chain):
    c1, c2, c3 = chain
    assert repo.checkout("dev") == mvc.Head("dev", c2)
    assert repo.resolve("HEAD") == c2
    assert repo.checkout(c1[:8]) == mvc.Head(None, c1)  # an id detaches HEAD
    assert repo.checkout("v1") == mvc.Head(None, c1)  # so does a tag
    assert repo.checkout("main~1") == mvc.Head(None, c2)
    with pytest.raises(UnknownRevision):
        repo.checkout("nope")
    assert repo.head() == mvc.Head(None, c2)
    assert repo.checkout("HEAD") == mvc.Head(None, c2)  # detached stays detached
    repo.checkout("main")
    assert repo.checkout("HEAD") == mvc.Head("main", c3) == repo.checkout("@")  # as in Git: still on main


def test_cli_checkout_of_an_empty_revision_is_an_error(repo, chain):
    from conftest import run_cli
    for args in (["checkout", ""], ["branch", "x", ""], ["tag", "t", ""]):
        result = run_cli(repo, *args)
        assert result.exit_code == 1 and "empty revision" in result.output, (args, result.output)
    assert repo.head() == mvc.Head("main", chain[2])


def test_commit_on_detached_head_moves_only_head(repo, chain):
    c1, c2, c3 = chain
    repo.checkout(c1)
    new = repo.commit({"w": torch.zeros(2)}, "on detached")
    assert new.parents == (c1,)
    assert repo.head() == mvc.Head(None, new.id)
    assert {b.name: b.id for b in repo.branches()} == {"dev": c2, "main": c3}
    assert [c.id for c in repo.log()] == [new.id, c1]


def test_commit_to_another_branch(repo, chain):
    c1, c2, c3 = chain
    new = repo.commit({"w": torch.zeros(2)}, "to dev", branch="dev")
    assert new.parents == (c2,) and repo.resolve("dev") == new.id
    assert repo.resolve("HEAD") == c3  # HEAD stays on main
    first = repo.commit({"w": torch.zeros(2)}, "new branch", branch="fresh")
    assert first.parents == () and repo.resolve("fresh") == first.id
    with pytest.raises(InvalidRefName):
        repo.commit({}, branch="a..b")


def test_reflog_records_every_move(repo, chain):
    c1, c2, c3 = chain
    with repo.index.read() as txn:
        main = [(e["old"], e["new"], e["message"]) for _, _, e in txn.reflog("heads/main")]
        dev = [e["message"] for _, _, e in txn.reflog("heads/dev")]
    assert main == [(None, bytes.fromhex(c1), "commit: c1"), (bytes.fromhex(c1), bytes.fromhex(c2), "commit: c2"),
                    (bytes.fromhex(c2), bytes.fromhex(c3), "commit: c3")]
    assert dev == [f"branch: {c2}"]


def test_a_branch_named_like_a_remote_tracking_ref_never_hides_it(repo, chain, tmp_path):
    c1, c2, c3 = chain
    repo.remotes.add("origin", str(tmp_path / "remote"))
    repo.remotes.push(refs=("main",))  # writes remotes/origin/main at c3
    assert repo.resolve("origin/main") == c3
    for make in (lambda: repo.create_branch("origin/main", c1), lambda: repo.create_tag("origin/main", c1),
                 lambda: repo.commit({"w": torch.zeros(2)}, "x", branch="origin/main"),
                 lambda: repo.checkout(c1, new_branch="origin/main"),
                 lambda: repo.rename_branch("dev", "origin/dev")):  # any name under a remote's tracking refs
        with pytest.raises(RefConflict) as err:
            make()
        assert "remote-tracking" in str(err.value)
    assert repo.resolve("origin/main") == c3 and repo.resolve("dev") == c2
    with repo.index.write() as txn:  # a branch made before the remote's first fetch (or by an older mvc)
        txn.set_ref("heads/origin/main", refs.RefValue(id=bytes.fromhex(c1)))
    with pytest.raises(AmbiguousRevision) as err:  # neither meaning is picked silently
        repo.resolve("origin/main~1")
    assert set(err.value.matches) == {"heads/origin/main", "remotes/origin/main"}
    assert repo.resolve("heads/origin/main") == c1 and repo.resolve("remotes/origin/main") == c3


def test_a_name_with_its_kind_is_not_taken_by_a_remote_of_that_name(repo, tmp_path):
    """With a remote named "tags", "tags/v1" (the tag v1 by its full name) resolved to that
    remote's branch v1 (remotes/tags/v1), another commit, without a word."""
    mine = repo.commit({"w": torch.zeros(2)}, "tagged")
    repo.create_tag("v1", mine.id)
    other = mvc.Repository.init(tmp_path / "other", chunk_size=64)
    theirs = other.commit({"w": torch.ones(2)}, "their v1", branch="v1")
    other.remotes.add("o", str(tmp_path / "remote"))
    other.remotes.push("o", ("v1",))
    other.close()
    import dataclasses
    from mvc.remote import config
    with pytest.raises(mvc.errors.InvalidRemoteName):  # refused as a new name now,
        repo.remotes.add("tags", str(tmp_path / "remote"))
    repo.remotes.add("o", str(tmp_path / "remote"))
    with repo.index.write() as txn:  # but one an older mvc added stays usable: settings as it wrote them
        config.put(txn, dataclasses.replace(config.get(txn, "o"), name="tags"))
    repo.remotes.fetch("tags")
    assert repo.resolve("remotes/tags/v1") == theirs.id
    assert repo.resolve("tags/v1") == mine.id and repo.resolve("v1") == mine.id
