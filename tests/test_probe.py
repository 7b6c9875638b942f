"""The findings of a hostile probe (issue 21), one section each: a repository
never stores or overwrites itself, what is written is readable, folder
exports are atomic as a whole and never write through links, no traceback,
linear revision parsing, leftovers cleaned, ref names without surprises.

Kills are real SIGKILLs of real child processes; a full disk is a write that
fails with ENOSPC (tests/faults.py), as in tests/test_enospc.py.
"""

import errno
import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file, save_file

import mvc
from mvc import files as files_mod
from mvc.cli import main

from conftest import SMALL_CHUNK
from faults import failing, on_small_tmpfs

PY = sys.executable


def cli(root, *args):
    return CliRunner().invoke(main, ["-C", str(root), *[str(a) for a in args]])


def model_folder(path, seed: int = 0, shards: int = 1, extra: dict = None):
    """A small Hugging Face-style folder: weights in ``shards`` files plus config.json."""
    path.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(seed)
    tensors = {f"layer{i}.w": torch.randn(8, 4, generator=g) for i in range(4)}
    if shards == 1:
        save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    else:
        keys = sorted(tensors)
        for n in range(shards):
            part = {k: tensors[k] for k in keys[n::shards]}
            save_file(part, path / f"model-{n + 1:05d}-of-{shards:05d}.safetensors", metadata={"format": "pt"})
        (path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {}}))
    (path / "config.json").write_text(json.dumps({"seed": seed}))
    for name, text in (extra or {}).items():
        (path / name).write_text(text)
    return tensors


def listing(root) -> dict:
    """{relative path: bytes} of every file under root (links not followed)."""
    out = {}
    for here, dirs, names in os.walk(root):
        for name in names:
            p = os.path.join(here, name)
            out[os.path.relpath(p, root)] = open(p, "rb").read()
    return out


def same_folder(a, b) -> bool:
    """Same file names, other files byte for byte, safetensors files tensor for tensor."""
    la, lb = listing(a), listing(b)
    if la.keys() != lb.keys():
        return False
    for name in la:
        if name.endswith(".safetensors"):
            ta, tb = load_file(os.path.join(a, name)), load_file(os.path.join(b, name))
            if ta.keys() != tb.keys() or not all(torch.equal(ta[k], tb[k]) for k in ta):
                return False
        elif la[name] != lb[name]:
            return False
    return True


# -- 1. a repository never stores or overwrites itself --------------------------

def test_a_folder_commit_leaves_out_any_mvc_and_says_so(tmp_path):
    model_folder(tmp_path)
    mvc.Repository.init(tmp_path, chunk_size=SMALL_CHUNK).close()
    (tmp_path / "sub").mkdir()
    mvc.Repository.init(tmp_path / "sub", chunk_size=SMALL_CHUNK).close()  # a nested one too
    out = cli(tmp_path, "commit", tmp_path, "-m", "the folder holding its own repository")
    assert out.exit_code == 0, out.output
    assert "left out of the model folder: .mvc/, sub/.mvc/" in out.stderr
    repo = mvc.Repository.open(tmp_path)
    files = repo.load("main")["__folder__"]["files"]
    assert sorted(files) == ["config.json"]  # nothing under any .mvc
    c = repo.commit_file(tmp_path)
    assert c.left_out == (".mvc/", "sub/.mvc/")
    repo.close()


def test_no_export_writes_into_the_repository(tmp_path):
    model_folder(tmp_path / "hf")
    repo = mvc.Repository.init(tmp_path, chunk_size=SMALL_CHUNK)
    first = repo.commit_file(tmp_path / "hf")
    index = repo.dir / "index" / "data.mdb"
    before = index.read_bytes()
    (tmp_path / "link.pt").symlink_to(repo.dir / "tmp" / "x.pt")
    for target in (index, repo.dir / "tmp" / "x.safetensors", repo.dir, tmp_path / "link.pt",
                   tmp_path / "nested" / ".mvc" / "w.pt"):
        with pytest.raises(mvc.errors.InsideRepository) as exc:
            repo.export("main", target, force=True)
        assert exc.value.repository.endswith(".mvc")
    # the folder that holds the repository: a folder export would replace it whole
    with pytest.raises(mvc.errors.InsideRepository) as exc:
        repo.export("main", tmp_path, force=True)
    assert exc.value.repository == str(repo.dir)
    out = cli(tmp_path, "export", "main", "-o", ".", "--force")
    assert out.exit_code == 1 and "holds the repository" in out.stderr and "Traceback" not in out.output
    assert index.read_bytes() == before and [c.id for c in repo.log()] == [first.id]
    assert not (repo.dir / "tmp" / "x.pt").exists()
    repo.close()


# -- 3. a folder export is atomic as a whole --------------------------------------

@pytest.fixture
def two_folders(tmp_path):
    """A repository with a single-file folder commit (old) and a sharded one (new)."""
    old_t = model_folder(tmp_path / "old", seed=1, extra={"tokenizer.json": "old"})
    new_t = model_folder(tmp_path / "new", seed=2, shards=2)
    repo = mvc.Repository.init(tmp_path / "repo", chunk_size=SMALL_CHUNK)
    old = repo.commit_file(tmp_path / "old")
    new = repo.commit_file(tmp_path / "new")
    yield repo, old, new, old_t, new_t
    repo.close()


def test_a_sharded_export_over_a_single_file_one_removes_the_old_weights(two_folders, tmp_path):
    repo, old, new, _, _ = two_folders
    out = tmp_path / "out"
    repo.export(old.id, out)
    repo.export(new.id, out, force=True)
    assert same_folder(out, tmp_path / "new")  # no stale model.safetensors, no tokenizer.json
    assert [p.name for p in tmp_path.iterdir() if ".tmp" in p.name] == []


def test_a_replace_never_removes_the_folder_a_user_works_in(two_folders, tmp_path, monkeypatch):
    repo, old, _, _, _ = two_folders
    project = tmp_path / "project"
    (project / "src").mkdir(parents=True)
    (project / "notes.txt").write_text("keep me")
    before = listing(project)
    monkeypatch.chdir(project)
    with pytest.raises(mvc.errors.ProtectedFolder) as exc:
        repo.export(old.id, project, force=True)
    assert (exc.value.reason, exc.value.path) == ("current-folder", str(project))
    monkeypatch.chdir(tmp_path)
    (project / ".git").mkdir()
    with pytest.raises(mvc.errors.ProtectedFolder) as exc:
        repo.export(old.id, project, force=True)
    assert (exc.value.reason, exc.value.path) == ("git-work-tree", str(project))
    assert {k: v for k, v in listing(project).items() if not k.startswith(".git")} == before


def test_a_full_disk_mid_export_leaves_the_whole_old_folder(two_folders, tmp_path):
    repo, old, new, _, _ = two_folders
    out = tmp_path / "out"
    repo.export(old.id, out)
    before = listing(out)
    with failing(files_mod, "write_bytes", after=3), pytest.raises(OSError) as exc:
        repo.export(new.id, out, force=True)  # the second shard's write fails
    assert exc.value.errno == errno.ENOSPC and "the folder is unchanged" in str(exc.value)
    assert "room for the new folder" in str(exc.value)
    assert listing(out) == before
    assert [p.name for p in tmp_path.iterdir() if ".tmp" in p.name] == []


KILLED_EXPORT = r"""
import os, signal, sys, mvc
repo = mvc.Repository.open(sys.argv[1])
def progress(done, total):
    if done and done < total:  # the first shard is written, the second not: die now
        os.kill(os.getpid(), signal.SIGKILL)
repo.export(sys.argv[2], sys.argv[3], force=True, write_progress=progress)
"""


def test_a_folder_export_killed_halfway_leaves_the_old_folder_and_the_next_cleans_up(two_folders, tmp_path):
    repo, old, new, _, _ = two_folders
    out = tmp_path / "out"
    repo.export(old.id, out)
    before = listing(out)
    child = subprocess.run([PY, "-c", KILLED_EXPORT, str(repo.root), new.id, str(out)], capture_output=True)
    assert child.returncode == -signal.SIGKILL, child.stderr
    assert listing(out) == before
    left = [p for p in tmp_path.iterdir() if ".tmp" in p.name]
    assert len(left) == 1 and left[0].name.startswith(".out.tmp")
    repo.export(new.id, out, force=True)  # the next export to the same target removes the leftover
    assert same_folder(out, tmp_path / "new")
    assert [p for p in tmp_path.iterdir() if ".tmp" in p.name] == []


# -- 4. nothing is written through a link; links are not followed into loops -------

def test_a_link_inside_the_target_is_never_written_through(two_folders, tmp_path):
    repo, old, new, _, _ = two_folders
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "mine.txt").write_text("keep")
    out = tmp_path / "out"
    repo.export(old.id, out)
    (out / "sub").symlink_to(elsewhere)
    folder = repo.load(new.id)
    folder["__folder__"]["files"]["sub/tokenizer.json"] = b"{}"
    crafted = repo.commit(folder, "a folder with a file in sub/")
    repo.export(crafted.id, out, force=True)
    assert listing(elsewhere) == {"mine.txt": b"keep"}
    assert not (out / "sub").is_symlink() and (out / "sub" / "tokenizer.json").read_bytes() == b"{}"


def test_a_folder_commit_refuses_a_link_to_a_folder_and_reads_a_link_to_a_file(tmp_path):
    model_folder(tmp_path / "hf")
    (tmp_path / "hf" / "again").symlink_to(".")
    repo = mvc.Repository.init(tmp_path / "repo", chunk_size=SMALL_CHUNK)
    with pytest.raises(mvc.errors.FolderLink) as exc:
        repo.commit_file(tmp_path / "hf")
    assert exc.value.path == "again" and exc.value.target == "."
    out = cli(repo.root, "commit", tmp_path / "hf")
    assert out.exit_code == 1 and out.stderr.count("\n") == 1 and "symbolic link to a folder" in out.stderr
    assert list(repo.log()) == []
    (tmp_path / "hf" / "again").unlink()
    (tmp_path / "vocab.txt").write_text("outside")  # a hub snapshot links its files to blobs elsewhere
    (tmp_path / "hf" / "vocab.txt").symlink_to(tmp_path / "vocab.txt")
    c = repo.commit_file(tmp_path / "hf")
    assert repo.load(c.id)["__folder__"]["files"]["vocab.txt"] == b"outside"
    (tmp_path / "hf" / "index.json").symlink_to(repo.dir / "FORMAT")  # into a repository: refused
    with pytest.raises(mvc.errors.FolderLink):
        repo.commit_file(tmp_path / "hf")
    repo.close()


# -- 2. what is written is readable ------------------------------------------------

def test_a_tensor_no_read_accepts_is_refused_before_anything_is_written(repo, tmp_path):
    import struct
    first = repo.commit({"w": torch.ones(3)}, "m")
    packs = sorted((repo.dir / "packs").iterdir())
    with pytest.raises(mvc.errors.TooLarge) as exc:
        repo.commit({"a": torch.empty(0, 2**62), "w": torch.ones(4)}, "never readable")
    assert exc.value.key == "a" and exc.value.shape == (0, 2**62)
    header = json.dumps({"a": {"dtype": "F32", "shape": [0, 2**62], "data_offsets": [0, 0]}}).encode()
    (tmp_path / "x.safetensors").write_bytes(struct.pack("<Q", len(header)) + header)
    with pytest.raises(mvc.errors.TooLarge):
        repo.commit_file(tmp_path / "x.safetensors")
    assert [c.id for c in repo.log()] == [first.id] and sorted((repo.dir / "packs").iterdir()) == packs
    # the class, not the instance: every object is checked by its own decoder before it is written
    from mvc.objects import TensorObject
    with pytest.raises(mvc.errors.Unreadable) as exc:
        TensorObject("F32", (2, 3), 64, ()).encode()  # chunks that do not cover it
    assert (exc.value.kind, exc.value.field) == ("tensor", "chunks")
    assert repo.fsck().ok


def test_an_unreadable_object_an_older_mvc_wrote_blocks_gc_until_fsck_prune_lost(repo):
    from mvc import encoding
    kept = repo.commit({"w": torch.ones(3)}, "good")
    made = repo.commit({"w": torch.ones(3) * 2}, "to be forged")
    w = bytes.fromhex(repo.entries(made.id)[0].tensor_id)
    bad = encoding.pack({"type": "tensor", "dtype": "F32", "shape": [0, 2**62], "chunk_size": 64, "chunks": []})
    with repo.index.write() as txn:  # what an mvc without the write-time check stored
        oid = repo.objects.put(txn, "tensors", bad)
        tree = repo.objects.put(txn, "trees", encoding.pack(
            {"type": "tree", "root": {"a": encoding.Ext(2, oid), "w": encoding.Ext(2, w)}}))
        record = repo.objects.commit(txn, bytes.fromhex(made.id))
        forged = repo.objects.put(txn, "commits", encoding.pack(
            {"type": "commit", "tree": tree, "parents": [bytes.fromhex(kept.id)], "message": "old", "author": "x",
             "time": record.time, "step": None, "epoch": None, "metrics": {}, "context": {}}))
        repo.refs.set_if_equals(txn, "heads/main", bytes.fromhex(made.id), forged, "forged")
    with pytest.raises(mvc.CorruptObject) as exc:
        repo.gc(grace=0)
    assert exc.value.id == oid.hex()
    assert mvc.fsck.prune_lost(repo) == (forged.hex(),)
    repo.gc(grace=0)  # runs again, and keeps the rest
    assert torch.equal(repo.load(kept.id)["w"], torch.ones(3)) and repo.fsck().ok


# -- 5. no traceback ------------------------------------------------------------------

@pytest.fixture
def optimizer_added(repo):
    """A model-only commit, then one that adds Adam's 0-dim ``step``."""
    a = repo.commit({"w": torch.ones(3)}, "model only", metrics={"loss": 1.0})
    b = repo.commit({"w": torch.ones(3), "opt": {"step": torch.tensor(5.0)}}, "with optimizer",
                    metrics={"loss": 2.0})
    return repo, a, b


def test_diff_and_bisect_show_an_added_zero_dim_tensor(optimizer_added):
    repo, a, b = optimizer_added
    for args in (("diff", a.id, b.id), ("diff", b.id, a.id)):
        out = cli(repo.root, *args)
        assert out.exit_code == 0 and "Traceback" not in out.output, out.output
    assert "opt.step  F32 scalar" in cli(repo.root, "diff", a.id, b.id).output
    assert cli(repo.root, "bisect", "start", b.id, a.id).exit_code == 0
    out = cli(repo.root, "bisect", "run", "--metric", "loss", "--threshold", "1.5", "--higher-is-worse")
    assert out.exit_code == 0 and "opt.step  F32 scalar" in out.output, out.output


def test_bad_revisions_plot_names_and_folder_names_are_one_line_errors(optimizer_added, tmp_path):
    repo, a, b = optimizer_added
    for args in (("log", "main\nx"), ("log", "a" * 40_000), ("show", "main~1\x00"), ("log", "main\u0085"),
                 ("diff", a.id, b.id, "--plot", tmp_path / "x.txt"),
                 ("log", "--plot", "loss", tmp_path / "x.txt")):
        out = cli(repo.root, *args)
        assert out.exit_code == 1 and out.stderr.count("\n") == 1, (args, out.output)
        assert out.stderr.startswith("mvc: error:") and "Traceback" not in out.output
    with pytest.raises(mvc.errors.RevisionTooLong) as exc:
        repo.resolve("main" + "~" * 40_000)
    assert exc.value.length == 40_004
    assert repo.resolve("main" + "^" * 1 + "~0" * 500) == a.id  # long but within the limit: parsed in one pass
    folder = {"w": torch.ones(2), "__folder__": {"files": {"a\x00b": b"x", ".mvc/FORMAT": b"x"},
                                                  "safetensors": {"model.safetensors": {"keys": ["w"]}}}}
    for name in ("a\x00b", ".mvc/FORMAT"):
        crafted = {**folder, "__folder__": {**folder["__folder__"], "files": {name: b"x"}}}
        c = repo.commit(crafted, "crafted")
        with pytest.raises(mvc.errors.UnsafeName) as exc:
            repo.export(c.id, tmp_path / "out")
        assert (exc.value.name, exc.value.problem) == (name, {"a\x00b": "control-character"}.get(name, "reserved"))
        out = cli(repo.root, "export", c.id, "-o", tmp_path / "out")
        assert out.exit_code == 1 and "Traceback" not in out.output
    assert not (tmp_path / "out").exists()


# -- 7. bisect run --timeout ------------------------------------------------------------

HANGS_AT_2 = r"""
import json, os, subprocess, sys, time
step = json.load(open(sys.argv[2]))[os.environ["MVC_COMMIT"]]  # no torch import: the timeout is short
if step == 2:  # hangs, and so does a process it started
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    open(sys.argv[1], "w").write(str(child.pid))
    time.sleep(600)
sys.exit(1 if step >= 3 else 0)
"""


@pytest.fixture
def five(repo):
    ids = [repo.commit({"w": torch.full((4,), float(i)), "step": i}, f"#{i}", step=i).id for i in range(5)]
    return repo, ids


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie nobody reaped yet is gone too
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


@pytest.mark.parametrize("flag", [None, "--timeout-bad"])
def test_bisect_run_kills_a_hanging_evaluation_and_everything_it_started(five, tmp_path, flag):
    repo, ids = five
    script, pidfile = tmp_path / "evaluate.py", tmp_path / "grandchild.pid"
    script.write_text(HANGS_AT_2)
    steps = tmp_path / "steps.json"
    steps.write_text(json.dumps({cid: i for i, cid in enumerate(ids)}))
    assert cli(repo.root, "bisect", "start", ids[4], ids[0]).exit_code == 0
    args = ["bisect", "run", "--timeout", "3", *([flag] if flag else []), "--json", PY, script, pidfile, steps]
    out = cli(repo.root, *args)
    assert out.exit_code == 0, out.output
    result = json.loads(out.stdout)
    if flag:  # the hang is the regression
        assert result["first_bad"]["id"] == ids[2]
    else:  # skipped: the first bad is #2 or #3, and Git's rule says so
        assert (result["first_bad"] or {}).get("id") != ids[2] and ids[2] in result["suspects"] + [ids[3]]
    assert not _alive(int(pidfile.read_text()))


def test_bisect_run_timeout_is_checked(five):
    repo, ids = five
    cli(repo.root, "bisect", "start", ids[4], ids[0])
    for args in (("--timeout", "0", "true"), ("--timeout", "nan", "true"), ("--timeout-bad", "true")):
        out = cli(repo.root, "bisect", "run", *args)
        assert out.exit_code in (1, 2) and out.stderr.count("\n") == 1, (args, out.output)
        assert "Traceback" not in out.output
    with pytest.raises(mvc.BadInput):
        repo.bisect.run(["true"], timeout=-1)


# -- 8. what killed commands leave is cleaned up and listed ---------------------------------

KILLS_ITS_PARENT = r"""
import os, signal
os.kill(os.getppid(), signal.SIGKILL)
"""

KILLED_FILE_EXPORT = r"""
import os, signal, sys, mvc
repo = mvc.Repository.open(sys.argv[1])
def progress(done, total):
    if done:
        os.kill(os.getpid(), signal.SIGKILL)
repo.export("main", sys.argv[2], force=True, write_progress=progress)
"""


def test_a_killed_bisect_run_leaves_scratch_that_fsck_lists_and_gc_or_the_next_run_removes(five, tmp_path):
    repo, ids = five
    script = tmp_path / "evaluate.py"
    script.write_text(KILLS_ITS_PARENT)
    code = f"import mvc, sys; r = mvc.Repository.open(sys.argv[1]); r.bisect.start({ids[4]!r}, {ids[0]!r}); " \
           f"r.bisect.run([sys.executable, sys.argv[2]])"
    child = subprocess.run([PY, "-c", code, str(repo.root), str(script)], capture_output=True, text=True)
    assert child.returncode == -signal.SIGKILL, child.stderr
    left = sorted(p.name for p in (repo.dir / "tmp").iterdir() if p.name.startswith("bisect-"))
    assert len(left) == 1 and list((repo.dir / "tmp" / left[0]).iterdir())  # a whole checkpoint
    assert repo.fsck().leftovers == (f"tmp/{left[0]}",)
    out = cli(repo.root, "fsck")
    assert out.exit_code == 0 and f"tmp/{left[0]}" in out.output
    # the next bisect run removes it
    repo.bisect.reset()
    repo.bisect.start(ids[4], ids[0])
    script.write_text("import sys; sys.exit(0)\n")
    with pytest.raises(mvc.MvcError):  # the bad end comes out good: stops, after cleaning up
        repo.bisect.run([PY, str(script)])
    assert not [p for p in (repo.dir / "tmp").iterdir() if p.name.startswith("bisect-")]
    # and so does gc, with any grace: the process that made it is gone
    gone = subprocess.run([PY, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (repo.dir / "tmp" / f"bisect-{gone.stdout.strip()}-x").mkdir()
    (repo.dir / "tmp" / f"bisect-{os.getpid()}-mine").mkdir()  # a live process's: left alone
    assert repo.gc().scratch_removed == (f"tmp/bisect-{gone.stdout.strip()}-x",)
    assert repo.fsck().leftovers == ()


def test_a_killed_file_export_leaves_a_temporary_file_the_next_export_removes(five, tmp_path):
    repo, ids = five
    target = tmp_path / "model.pt"
    child = subprocess.run([PY, "-c", KILLED_FILE_EXPORT, str(repo.root), str(target)], capture_output=True)
    assert child.returncode == -signal.SIGKILL, child.stderr
    left = [p.name for p in tmp_path.iterdir() if p.name.startswith(".model.pt.tmp")]
    assert len(left) == 1 and not target.exists()
    repo.export("main", target)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".model.pt")] == []
    assert torch.load(target, weights_only=True)["step"] == 4


# -- 9. a name means one thing, and reads as what it is -----------------------------------------

def test_names_that_read_as_other_names_are_refused(repo):
    c = repo.commit({"w": torch.ones(2)}, "m")
    for name in ("a\u202eb", "rel\u00a0ease", "x\u2028y", "x\u0085y", "x\u200by", "tags/v3", "heads/x",
                 "remotes/origin/main"):
        for make in (repo.create_branch, repo.create_tag):
            with pytest.raises(mvc.InvalidRefName):
                make(name, c.id)
        with pytest.raises(mvc.InvalidRefName):
            repo.commit({"w": torch.ones(2)}, "m", branch=name)
    out = cli(repo.root, "branch", "tags/v3")
    assert out.exit_code == 1 and "names a kind of ref" in out.stderr
    repo.create_branch("café", c.id)  # plain letters from any script are fine
    assert [b.name for b in repo.branches()] == ["café", "main"]


def test_a_branch_and_a_tag_of_one_name_cannot_both_exist(repo):
    c = repo.commit({"w": torch.ones(2)}, "m")
    repo.create_tag("v3", c.id)
    repo.create_branch("dev", c.id)
    with pytest.raises(mvc.RefConflict):
        repo.create_branch("v3", c.id)
    with pytest.raises(mvc.RefConflict):
        repo.create_tag("dev", c.id)
    with pytest.raises(mvc.RefConflict):
        repo.commit({"w": torch.zeros(2)}, "m", branch="v3")
    with pytest.raises(mvc.RefConflict):
        repo.checkout(c.id, new_branch="v3")
    with pytest.raises(mvc.RefConflict):
        repo.rename_branch("dev", "v3")
    assert sorted(b.name for b in repo.branches()) == ["dev", "main"] and [t.name for t in repo.tags()] == ["v3"]


def test_a_branch_named_like_an_id_prefix_does_not_hide_the_commit(repo):
    a = repo.commit({"w": torch.ones(2)}, "a")
    b = repo.commit({"w": torch.zeros(2)}, "b")
    repo.create_branch(b.id[:7], a.id)
    with pytest.raises(mvc.AmbiguousRevision):
        repo.resolve(b.id[:7])
    out = cli(repo.root, "log", b.id[:7])
    assert out.exit_code == 1 and f"heads/{b.id[:7]}" in out.stderr
    assert repo.resolve(f"heads/{b.id[:7]}") == a.id and repo.resolve(b.id[:8]) == b.id


# -- 10. what the README says, and numbers without noise ----------------------------------------------

def test_views_of_one_storage_come_back_as_the_readme_says(repo):
    w = torch.arange(6.0).reshape(2, 3)
    c = repo.commit({"a": w, "tied": w, "t": w.t()}, "views")
    back = repo.load(c.id)
    assert back["a"] is back["tied"]  # the same view: one tensor again
    assert torch.equal(back["t"], w.t())
    back["a"].add_(1)  # another view comes back independent, as the README says
    assert torch.equal(back["t"], w.t())


def test_diff_numbers_are_quiet_and_signed_zeros_and_containers_show(repo):
    import warnings
    a = repo.commit({"z": torch.zeros(3), "big": torch.tensor([1e308, -1e308], dtype=torch.float64),
                     "betas": [0.9, 0.99], "p": [torch.ones(1)], "e": []}, "a")
    b = repo.commit({"z": -torch.zeros(3), "big": torch.tensor([-1e308, 1e308], dtype=torch.float64),
                     "betas": (0.9, 0.99), "p": (torch.ones(1),), "e": {}}, "b")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a numpy RuntimeWarning fails the test
        d = repo.diff(a.id, b.id)
    by_key = {t.key: t for t in d.tensors}
    assert by_key["z"].status == "changed" and by_key["z"].relative_change == 0.0
    assert {v.key: (v.a, v.b) for v in d.values} == {"betas": ([0.9, 0.99], (0.9, 0.99)), "e": ([], {}),
                                                       "p": ("<list of 1>", "<tuple of 1>")}
    out = cli(repo.root, "diff", a.id, b.id)
    assert "Warning" not in out.output and "rel inf" not in out.output
    assert "betas  [0.9, 0.99] -> (0.9, 0.99)" in out.output


def test_safetensors_dtypes_imported_can_be_exported_back(repo, tmp_path):
    from safetensors import safe_open
    st = {"c": torch.randn(3, dtype=torch.complex64), "e": torch.ones(4).to(torch.float8_e8m0fnu),
          "f4": torch.arange(6, dtype=torch.uint8).reshape(2, 3).view(torch.float4_e2m1fn_x2),
          "fz": torch.ones(3).to(torch.float8_e4m3fnuz)}
    save_file(st, tmp_path / "in.safetensors")
    c = repo.commit_file(tmp_path / "in.safetensors")
    repo.export(c.id, tmp_path / "out.safetensors")
    with safe_open(tmp_path / "out.safetensors", framework="pt") as f:
        for k in st:
            t = f.get_tensor(k)
            assert t.dtype == st[k].dtype and torch.equal(t.view(torch.uint8), st[k].view(torch.uint8))
    with pytest.raises(mvc.errors.CannotHold) as exc:
        repo.export(repo.commit({"x": torch.zeros(2, dtype=torch.complex128)}).id, tmp_path / "c128.safetensors")
    assert (exc.value.format, exc.value.key, exc.value.dtype) == ("safetensors", "x", "C128")


# -- 6. a full disk: one line that says so, and gc gets the user out ---------------------------------

FULL_DISK = r"""
import json, os, subprocess, sys, torch, mvc
root = sys.argv[1]
out = {}

from click.testing import CliRunner
from mvc.cli import main

def mvc_cli(*args):  # in this process: a SIGBUS kills the whole child, which the test sees
    p = CliRunner().invoke(main, list(args))
    return {"rc": p.exit_code, "err": p.stderr}

def fill(leave_kib=0):
    filler = os.path.join(root, "filler")
    if os.path.exists(filler):
        os.unlink(filler)
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
    try:
        while os.write(fd, b"\0" * 4096):
            pass
    except OSError:
        pass
    os.close(fd)
    if leave_kib:
        os.truncate(filler, max(0, os.path.getsize(filler) - leave_kib * 1024))

def empty():
    os.unlink(os.path.join(root, "filler"))

fill()
out["init_full"] = mvc_cli("init", os.path.join(root, "r1"))
out["init_left"] = sorted(os.listdir(os.path.join(root, "r1"))) if os.path.exists(os.path.join(root, "r1")) else []
fill(leave_kib=12)
out["init_12k"] = mvc_cli("init", os.path.join(root, "r2"))
empty()
repo = mvc.Repository.init(os.path.join(root, "r3"), chunk_size=4096)
keep = repo.commit({"w": torch.randn(50_000, generator=torch.Generator().manual_seed(0))}, "keep").id
repo.commit({"w": torch.randn(200_000, generator=torch.Generator().manual_seed(1))}, "garbage", branch="tmp",
            start="HEAD")
repo.delete_branch("tmp", force=True)
repo.close()
os.unlink(os.path.join(root, "r3", ".mvc", "index", "lock.mdb"))
fill()
out["log_no_lock"] = mvc_cli("-C", os.path.join(root, "r3"), "log")
out["commit_full"] = mvc_cli("-C", os.path.join(root, "r3"), "commit", os.path.join(root, "r3", "nothing.pt"))
empty()
mvc.Repository.open(os.path.join(root, "r3")).close()  # lock.mdb made again
fill()
out["expire_full"] = mvc_cli("-C", os.path.join(root, "r3"), "reflog", "expire", "tmp")  # as Git's reflog expire
out["gc_full"] = mvc_cli("-C", os.path.join(root, "r3"), "gc", "--grace", "0")
out["free_after_gc"] = os.statvfs(root).f_bavail * os.statvfs(root).f_frsize
out["fsck"] = mvc_cli("-C", os.path.join(root, "r3"), "fsck")
repo = mvc.Repository.open(os.path.join(root, "r3"))
out["intact"] = repo.resolve("main") == keep and torch.equal(
    repo.load(keep)["w"], torch.randn(50_000, generator=torch.Generator().manual_seed(0)))
print(json.dumps(out))
"""


def test_a_full_disk_is_one_line_and_gc_frees_it(tmp_path):
    r = on_small_tmpfs(tmp_path, FULL_DISK)
    for step in ("init_full", "init_12k", "log_no_lock", "commit_full"):
        assert r[step]["rc"] == 1, (step, r[step])  # not 135 (SIGBUS) and no traceback
        assert r[step]["err"].count("\n") == 1 and "No space left on device" in r[step]["err"], (step, r[step])
        assert "damaged" not in r[step]["err"] and "Input/output" not in r[step]["err"]
    assert r["init_left"] == []  # no .mvc-init-* staging folder left behind
    assert r["gc_full"]["rc"] == 0, r["gc_full"]
    assert r["free_after_gc"] > 500_000  # the garbage commit's pack is gone
    assert r["fsck"]["rc"] == 0 and r["intact"]


def test_a_ref_made_before_the_name_rules_can_still_be_deleted(repo):
    from mvc.store.index import RefValue
    c = repo.commit({"w": torch.ones(2)}, "m")
    with repo.index.write() as txn:  # what an older mvc let a user create
        txn.set_ref("heads/tags/v3", RefValue(id=bytes.fromhex(c.id)))
        txn.set_ref("tags/r\u202eelease", RefValue(id=bytes.fromhex(c.id)))
    repo.delete_branch("tags/v3")
    repo.delete_tag("r\u202eelease")
    assert [b.name for b in repo.branches()] == ["main"] and repo.tags() == []


def test_the_staging_folder_of_a_killed_init_is_removed_by_the_next(tmp_path):
    gone = subprocess.run([PY, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    left = tmp_path / f".mvc-init-{gone.stdout.strip()}-0123456789abcdef"
    (left / "index").mkdir(parents=True)  # what an init killed halfway leaves
    mine = tmp_path / f".mvc-init-{os.getpid()}-fedcba9876543210"
    mine.mkdir()  # a live process's: left alone
    mvc.Repository.init(tmp_path).close()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([".mvc", mine.name])
