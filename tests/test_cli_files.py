"""Importing and exporting checkpoint files from the terminal: safe outputs, metadata, subtrees, progress."""

import io
import json
import os
import subprocess
import sys

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

import mvc
from mvc.cli.base import Progress
from mvc.errors import Unstorable


def _state(seed=0):
    g = torch.Generator().manual_seed(seed)
    return {"model": {"w": torch.randn(8, 8, generator=g), "b": torch.randn(8, generator=g)},
            "head": {"w": torch.randn(2, 8, generator=g)}, "step": 3}


def one_line(result, text):
    assert text in result.stderr, result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.output


@pytest.fixture
def committed(cli, tmp_path):
    torch.save(_state(), tmp_path / "a.pt")
    cli("commit", "a.pt", "-m", "x")
    return cli


def test_checkout_refuses_an_existing_output_unless_forced(committed, tmp_path):
    source = tmp_path / "a.pt"
    before = source.read_bytes()
    torch.save(_state(1), tmp_path / "b.pt")
    committed("commit", "b.pt", "-m", "y")
    one_line(committed("checkout", "HEAD~1", "-o", "b.pt", code=1), "b.pt already exists; pass --force")
    one_line(committed("export", "-o", "a.pt", code=1), "already exists")
    assert source.read_bytes() == before
    committed("checkout", "HEAD", "-o", "a.pt", "--force")
    assert torch.equal(torch.load(source, weights_only=True)["model"]["w"], _state(1)["model"]["w"])
    assert [p.name for p in tmp_path.iterdir() if ".tmp" in p.name] == []


def test_export_over_a_private_file_keeps_its_mode(committed, tmp_path):
    target = tmp_path / "secret.pt"
    target.write_bytes(b"old")
    target.chmod(0o600)
    committed("export", "-o", target, "--force")
    assert target.stat().st_mode & 0o777 == 0o600
    assert torch.equal(torch.load(target, weights_only=True)["head"]["w"], _state()["head"]["w"])
    committed("export", "-o", "fresh.safetensors")
    umask = os.umask(0)
    os.umask(umask)
    assert (tmp_path / "fresh.safetensors").stat().st_mode & 0o777 == 0o666 & ~umask


def test_format_that_contradicts_the_suffix_is_refused(committed, tmp_path):
    one_line(committed("checkout", "HEAD", "-o", "head.pt", "--format", "safetensors", code=1),
             "format safetensors does not match the name head.pt")
    one_line(committed("export", "-o", "w.safetensors", "--format", "pt", code=1), "name it w.pt")
    assert not (tmp_path / "head.pt").exists() and not (tmp_path / "w.safetensors").exists()
    committed("export", "-o", "w.weights", "--format", "safetensors")  # an unknown suffix is the user's call
    assert set(load_file(tmp_path / "w.weights")) == {"model.w", "model.b", "head.w"}


def test_safetensors_metadata_survives_commit_and_export(cli, tmp_path):
    tensors = {"a": torch.arange(6, dtype=torch.float32), "b": torch.ones(2, 3, dtype=torch.bfloat16)}
    save_file(tensors, str(tmp_path / "in.safetensors"), metadata={"format": "pt", "source": "unit test"})
    cli("commit", "in.safetensors", "-m", "st")
    assert json.loads(cli("show", "--json").output)["commit"]["context"]["safetensors"] == {
        "metadata": {"format": "pt", "source": "unit test"}}
    cli("export", "-o", "out.safetensors")
    with safe_open(str(tmp_path / "out.safetensors"), "pt") as f:
        assert f.metadata() == {"format": "pt", "source": "unit test"}
        assert all(torch.equal(f.get_tensor(k), v) and f.get_tensor(k).dtype == v.dtype for k, v in tensors.items())


def test_a_tensor_named_like_the_safetensors_metadata_is_refused(tmp_path):
    """A tensor keyed '__metadata__' took the header's metadata slot: the file could not be read back."""
    import mvc
    repo = mvc.Repository.init(tmp_path / "r")
    repo.commit({"__metadata__": torch.ones(2), "w": torch.zeros(3)})
    with pytest.raises(mvc.errors.CannotHold) as err:
        repo.export("HEAD", tmp_path / "x.safetensors")
    assert err.value.key == "__metadata__" and not (tmp_path / "x.safetensors").exists()
    repo.export("HEAD", tmp_path / "x.pt")  # pt holds it
    assert torch.equal(torch.load(tmp_path / "x.pt", weights_only=True)["__metadata__"], torch.ones(2))
    repo.close()


def test_a_bare_tensor_file_is_named_root_and_round_trips(cli, tmp_path):
    t = torch.arange(12, dtype=torch.int32).reshape(3, 4)
    torch.save(t, tmp_path / "t.pt")
    cli("commit", "t.pt")
    shown = cli("show", "--tensors").output
    assert "<root>" in shown and "''" not in shown
    cli("export", "-o", "back.pt")
    back = torch.load(tmp_path / "back.pt", weights_only=True)
    assert isinstance(back, torch.Tensor) and torch.equal(back, t)


def test_commit_without_a_message_says_what_it_committed(cli, tmp_path):
    torch.save(_state(), tmp_path / "a.pt")
    out = cli("commit", "a.pt").output
    assert "] Import a.pt: 3 tensors" in out
    assert json.loads(cli("log", "--json").output)[0]["message"] == "Import a.pt: 3 tensors"
    cli("commit", "a.pt", "-m", "")  # an explicit empty message is taken as given
    assert json.loads(cli("log", "--json").output)[0]["message"] == ""


def test_a_state_dict_file_counts_its_tensors(cli, tmp_path):
    """torch.save(model.state_dict()) stores an OrderedDict: its tensors are counted as a dict's."""
    model = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.BatchNorm1d(3))
    torch.save(model.state_dict(), tmp_path / "sd.pt")
    assert "] Import sd.pt: 7 tensors" in cli("commit", "sd.pt").output


def test_a_state_dicts_module_metadata_survives_import_and_export(cli, tmp_path, monkeypatch):
    """The _metadata torch.save keeps with a state_dict (module versions) comes back
    in a pt export, streamed or not, as torch.load gives it from the original."""
    model = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.BatchNorm1d(3))
    torch.save({"model": model.state_dict(), "step": 3}, tmp_path / "in.pt")
    original = torch.load(tmp_path / "in.pt", weights_only=True)
    cli("commit", "in.pt")
    cli("export", "-o", "streamed.pt")
    monkeypatch.setattr("mvc.files.can_stream_torch", lambda: False)
    cli("export", "-o", "whole.pt")
    for name in ("streamed.pt", "whole.pt"):
        back = torch.load(tmp_path / name, weights_only=True)
        assert back["model"]._metadata == original["model"]._metadata, name
        assert {k: v.reshape(-1).view(torch.uint8).tolist() for k, v in back["model"].items()} == \
            {k: v.reshape(-1).view(torch.uint8).tolist() for k, v in original["model"].items()}, name


def test_export_a_subtree_as_a_flat_state_dict(committed, tmp_path):
    committed("checkout", "HEAD", "-o", "model.safetensors", "--only", "model.*", "--strip-prefix", "model.")
    flat = load_file(tmp_path / "model.safetensors")
    assert set(flat) == {"w", "b"} and torch.equal(flat["w"], _state()["model"]["w"])
    module = torch.nn.Linear(8, 8)
    module.load_state_dict({"weight": flat["w"], "bias": flat["b"]})
    committed("export", "-o", "model.pt", "--only", "model.*", "--strip-prefix", "model.")
    assert set(torch.load(tmp_path / "model.pt", weights_only=True)) == {"w", "b"}
    one_line(committed("export", "-o", "none.pt", "--only", "decoder.*", code=1), "no key matches only='decoder.*'")
    one_line(committed("export", "-o", "bad.pt", "--strip-prefix", "model.", code=1), "does not start with")
    assert "need -o/--output" in committed("checkout", "HEAD", "--only", "x", code=2).stderr


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_progress_names_the_phase_and_shows_bytes_and_throughput():
    screen = _Terminal()
    with Progress("hashing", then="syncing to disk", stream=screen) as bar:
        bar(0, 3 << 20)
        assert "hashing" in screen.getvalue()  # drawn before any work is done
        bar(1 << 20, 3 << 20)
        bar(3 << 20, 3 << 20)
    text = screen.getvalue()
    assert "3.0 MiB of 3.0 MiB" in text and "/s" in text and "syncing to disk ..." in text
    piped = io.StringIO()
    with Progress("reading", total=10, stream=piped) as bar:
        bar(10, 10)
    assert piped.getvalue() == ""


def test_commit_and_export_report_each_phase(committed, tmp_path, monkeypatch):
    seen = []
    real = Progress.__call__

    def spy(self, done, total):
        seen.append((self.phase, done, total))
        return real(self, done, total)
    monkeypatch.setattr(Progress, "__call__", spy)
    torch.save(_state(2), tmp_path / "c.pt")
    committed("commit", "c.pt", "-m", "z")
    committed("export", "-o", "c.safetensors")
    phases = [p for p, _, _ in seen]
    assert phases.index("reading") < phases.index("hashing")
    assert {"reading", "hashing", "writing"} <= set(phases)
    for phase in ("reading", "hashing", "writing"):
        calls = [(d, t) for p, d, t in seen if p == phase]
        assert calls[0][0] == 0  # each starts at once
        assert calls[-1][0] == calls[-1][1]  # and ends complete


def test_a_nested_tensor_is_bad_input(repo):
    nested = torch.nested.nested_tensor([torch.ones(2), torch.ones(3)])
    with pytest.raises(Unstorable) as err:
        repo.commit({"x": nested})
    assert (err.value.key, err.value.reason) == ("x", "nested-tensor")


EXPORT_ON_SMALL_DISKS = r"""
import os, sys, subprocess, json
mnt, repo = sys.argv[1], sys.argv[2]
out = {}
os.system(f"mount -t tmpfs -o size=64k tmpfs {mnt}/full && mount -t tmpfs -o ro tmpfs {mnt}/ro")
for name, target in (("full_pt", "full/x.pt"), ("full_st", "full/x.safetensors"), ("ro", "ro/x.pt")):
    p = subprocess.run([sys.executable, "-m", "mvc", "-C", repo, "export", "-o", f"{mnt}/{target}"],
                       capture_output=True, text=True)
    out[name] = [p.returncode, p.stderr, sorted(os.listdir(os.path.dirname(f"{mnt}/{target}")))]
print(json.dumps(out))
"""


def test_export_to_a_full_disk_or_read_only_folder_is_one_line(tmp_path):
    with mvc.Repository.init(tmp_path / "r") as repo:
        repo.commit({"w": torch.randn(64 << 10)}, "256 KiB")  # more than the small disk holds
    for sub in ("full", "ro"):
        (tmp_path / sub).mkdir()
    try:
        proc = subprocess.run(["unshare", "-rm", sys.executable, "-c", EXPORT_ON_SMALL_DISKS, str(tmp_path),
                               str(tmp_path / "r")], capture_output=True, text=True, timeout=120)
    except FileNotFoundError:
        pytest.skip("no unshare(1) here")
    if proc.returncode != 0 or not proc.stdout.strip():
        pytest.skip(f"cannot mount small filesystems here: {proc.stderr.strip()[:200]}")
    result = json.loads(proc.stdout)
    for name, why in (("full_pt", "No space left on device"), ("full_st", "No space left on device"),
                      ("ro", "Read-only file system")):
        code, stderr, left = result[name]
        assert code == 1, (name, stderr)
        assert stderr.startswith("mvc: error: " + why) and "nothing was written" in stderr, (name, stderr)
        assert stderr.count("\n") == 1 and "Traceback" not in stderr
        assert left == [], (name, left)  # no partial file, no temporary file
