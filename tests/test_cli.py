"""The core commands through click's runner: output, JSON, exit codes, bad input."""

import json
import os

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file, save_file

import mvc
from mvc.cli import main
from mvc.errors import Unstorable


def _state(seed=0):
    torch.manual_seed(seed)
    return {"model": {"w": torch.randn(8, 8), "b": torch.randn(8)}, "step": 3, "cfg": ("a", 1.5)}


def test_commit_log_show(cli, tmp_path):
    torch.save(_state(), tmp_path / "a.pt")
    out = cli("commit", "a.pt", "-m", "first", "--step", "10", "--metric", "loss=2.5",
              "--context", "lr=0.001", "--context", "opt=adamw").output
    assert "[main (root-commit) " in out and "first" in out and "new" in out and "shared" in out
    state = _state()
    state["model"]["w"][0, 0] += 1
    torch.save(state, tmp_path / "b.pt")
    out = cli("commit", "b.pt", "-m", "second", "--step", "20", "--metric", "loss=2.0").output
    # one 64-byte chunk of w changed; everything else is shared
    assert "64 B new" in out

    oneline = cli("log", "--oneline").output.splitlines()
    assert len(oneline) == 2
    assert "(HEAD -> main)" in oneline[0] and "step 20" in oneline[0] and "loss=2" in oneline[0]
    assert oneline[1].endswith("first")
    assert len(cli("log", "-n", "1", "--oneline").output.splitlines()) == 1

    commits = json.loads(cli("log", "--json").output)
    assert [c["message"] for c in commits] == ["second", "first"]
    assert commits[1]["context"] == {"lr": 0.001, "opt": "adamw"}
    assert commits[0]["parents"] == [commits[1]["id"]]

    shown = cli("show", "HEAD~1", "--tensors").output
    assert "lr: 0.001" in shown and "model.w" in shown and "F32" in shown and "cfg.0" in shown
    data = json.loads(cli("show", commits[0]["id"][:8], "--json", "--tensors").output)
    assert data["commit"]["step"] == 20
    keys = {e["key"]: e for e in data["entries"]}
    assert keys["model.w"]["shape"] == [8, 8] and keys["model.w"]["chunks"] == 4
    assert keys["step"]["value"] == 3


def test_checkout_says_it_wrote_no_file(cli, tmp_path):
    """mvc has no working tree: a Git user expects checkout to change the file, so it says it did not."""
    torch.save(_state(), tmp_path / "a.pt")
    cli("commit", "a.pt", "-m", "one")
    cli("commit", "a.pt", "-m", "two")
    before = (tmp_path / "a.pt").read_bytes()
    out = cli("checkout", "HEAD~1")
    assert "HEAD is now detached at" in out.stdout
    assert "No file was written; 'mvc checkout HEAD~1 -o FILE' writes this checkpoint out." in out.stderr
    assert (tmp_path / "a.pt").read_bytes() == before


def test_checkout_to_files_round_trips(cli, tmp_path):
    state = _state()
    torch.save(state, tmp_path / "a.pt")
    cli("commit", "a.pt", "-m", "x")
    cli("checkout", "HEAD", "-o", "out.pt")
    back = torch.load(tmp_path / "out.pt", weights_only=True)
    assert torch.equal(back["model"]["w"], state["model"]["w"]) and back["cfg"] == ("a", 1.5)
    cli("checkout", "main", "-o", "out.safetensors")
    flat = load_file(str(tmp_path / "out.safetensors"))
    assert set(flat) == {"model.w", "model.b"}
    assert torch.equal(flat["model.b"], state["model"]["b"])
    cli("export", "-o", "again.bin", "--format", "pt")
    assert torch.equal(torch.load(tmp_path / "again.bin", weights_only=True)["model"]["b"], state["model"]["b"])


def test_commit_safetensors_file(cli, tmp_path):
    tensors = {"a": torch.arange(10, dtype=torch.int16), "b": torch.ones(2, 2, dtype=torch.bfloat16)}
    save_file(tensors, str(tmp_path / "w.safetensors"))
    cli("commit", "w.safetensors", "-m", "st")
    with mvc.Repository.open(tmp_path) as repo:
        back = repo.load()
    assert back.keys() == tensors.keys()
    assert all(torch.equal(back[k], tensors[k]) and back[k].dtype == tensors[k].dtype for k in tensors)


def test_branches_tags_and_checkout(cli, tmp_path):
    torch.save(_state(0), tmp_path / "a.pt")
    torch.save(_state(1), tmp_path / "b.pt")
    cli("commit", "a.pt", "-m", "one")
    cli("commit", "b.pt", "-m", "two")
    cli("branch", "exp", "HEAD~1")
    listing = cli("branch").output
    assert "* main" in listing and "  exp" in listing
    cli("tag", "v1", "HEAD~1", "--protect")
    assert "[protected]" in cli("tag").output
    err = cli("tag", "v1", "HEAD", code=1)
    assert "protected" in err.stderr and "Traceback" not in err.output
    cli("tag", "-d", "v1", code=1)
    cli("tag", "v1", "HEAD", "--force")
    cli("tag", "-d", "v1", "--force")
    assert cli("tag").output == ""

    assert "branch 'exp'" in cli("checkout", "exp").output
    assert json.loads(cli("status", "--json").output)["head"]["branch"] == "exp"
    cli("commit", "a.pt", "-m", "on exp")
    assert [c["message"] for c in json.loads(cli("log", "--json").output)] == ["on exp", "one"]
    assert [c["message"] for c in json.loads(cli("log", "main", "--json").output)] == ["two", "one"]
    err = cli("branch", "-d", "exp", code=1)
    assert "checked out" in err.stderr
    main_id = json.loads(cli("log", "main", "-n", "1", "--json").output)[0]["id"]
    assert "detached" in cli("checkout", main_id[:10]).output
    assert "HEAD detached" in cli("status").output
    assert "not merged into HEAD" in cli("branch", "-d", "exp", code=1).stderr
    assert "Deleted branch exp (was " in cli("branch", "-D", "exp").output
    assert "exp" not in cli("branch").output


@pytest.mark.parametrize("args, message", [
    (["show", "nope"], "unknown revision 'nope'"),
    (["show", "HEAD~5"], "has no parent"),
    (["commit", "missing.pt"], "no such file"),
    (["commit", "notes.txt"], "unknown checkpoint type"),
    (["commit", "garbage.pt"], "not a readable PyTorch checkpoint"),
    (["commit", "evil.pt"], "never unpickles"),
    (["commit", "garbage.safetensors"], "not a readable safetensors file"),
    (["branch", "bad name"], "not valid"),
    (["branch", "a..b"], "not valid"),
    (["tag", "x~1"], "not valid"),
])
def test_bad_input_is_one_line_and_exit_1(cli, tmp_path, args, message):
    torch.save(_state(), tmp_path / "a.pt")
    cli("commit", "a.pt")
    (tmp_path / "notes.txt").write_text("hi")
    (tmp_path / "garbage.pt").write_bytes(os.urandom(100))
    (tmp_path / "garbage.safetensors").write_bytes(os.urandom(100))
    torch.save({"e": _Evil()}, tmp_path / "evil.pt")
    result = cli(*args, code=1)
    assert message in result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.output
    assert not (tmp_path / "pwned").exists()


class _Evil:
    def __reduce__(self):
        return (os.system, ("touch pwned",))


def test_unsupported_object_in_state_names_key(cli, tmp_path):
    torch.save({"model": {"w": torch.ones(2)}, "bad": {"deep": torch.nn.Linear(1, 1)}}, tmp_path / "m.pt")
    # A Linear module is refused by torch's weights-only loader before mvc sees it
    assert "never unpickles" in cli("commit", "m.pt", code=1).stderr
    with mvc.Repository.open(tmp_path) as repo:
        with pytest.raises(Unstorable) as err:
            repo.commit({"bad": {"deep": object()}})
        assert err.value.key == "bad.deep"


def test_not_a_repository(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["log"])
    assert result.exit_code == 1 and "not an mvc repository" in result.stderr
    result = CliRunner().invoke(main, ["-C", str(tmp_path / "nowhere"), "status"])
    assert result.exit_code == 1


def test_usage_errors_exit_2(cli):
    assert cli("log", "--bogus", code=2)
    assert cli("checkout", "HEAD", "--format", "pt", code=2)


def test_conflicting_commit_is_a_clear_error(cli, tmp_path, monkeypatch):
    torch.save(_state(), tmp_path / "a.pt")
    cli("commit", "a.pt", "-m", "base")
    real = mvc.commits.write_chunks
    raced = []

    def racing(repo, slots, progress):
        if not raced:  # another writer lands first, once
            raced.append(True)
            with mvc.Repository.open(tmp_path) as other:
                other.commit({"x": torch.zeros(1)}, "racer")
        return real(repo, slots, progress)
    monkeypatch.setattr(mvc.commits, "write_chunks", racing)
    result = cli("commit", "a.pt", "-m", "loser", code=1)
    assert "moved" in result.stderr and "nothing was committed" in result.stderr
    monkeypatch.setattr(mvc.commits, "write_chunks", real)
    assert [c["message"] for c in json.loads(cli("log", "--json").output)] == ["racer", "base"]


def test_log_marks_pruned_commits(cli, tmp_path):
    for i in range(3):
        torch.save(_state(i), tmp_path / "a.pt")
        cli("commit", "a.pt", "-m", f"c{i}")
    with mvc.Repository.open(tmp_path) as repo:
        repo.gc(keep_last=1)
    lines = cli("log", "--oneline").output.splitlines()
    assert ["[pruned]" in line for line in lines] == [False, True, True]


def test_export_keeps_symlinks_and_refuses_special_files(cli, tmp_path):
    state = _state()
    torch.save(state, tmp_path / "a.pt")
    cli("commit", "a.pt", "-m", "x")
    (tmp_path / "real.pt").write_bytes(b"old")
    (tmp_path / "link.pt").symlink_to(tmp_path / "real.pt")
    assert "symbolic link" in cli("export", "-o", "link.pt", code=1).stderr
    assert (tmp_path / "real.pt").read_bytes() == b"old"
    cli("export", "-o", "link.pt", "--force")
    assert (tmp_path / "link.pt").is_symlink()
    assert torch.equal(torch.load(tmp_path / "real.pt", weights_only=True)["model"]["w"], state["model"]["w"])
    os.mkfifo(tmp_path / "fifo.pt")
    assert "not a regular file" in cli("export", "-o", "fifo.pt", code=1).stderr
    assert "does not exist" in cli("export", "-o", "nowhere/x.pt", code=1).stderr


def test_show_of_a_pruned_commit_shows_its_record(cli, tmp_path):
    for i in range(2):
        torch.save(_state(i), tmp_path / "a.pt")
        cli("commit", "a.pt", "-m", f"c{i}", "--metric", f"loss={i}")
    with mvc.Repository.open(tmp_path) as repo:
        repo.gc(keep_last=1)
    out = cli("show", "HEAD~1", "--tensors").output
    assert "[pruned" in out and "c0" in out and "loss=0" in out and "Tree:" not in out


def test_safetensors_export_says_what_it_left_out(cli, tmp_path):
    torch.save(_state(), tmp_path / "a.pt")  # holds "step" and "cfg" besides tensors
    cli("commit", "a.pt")
    result = cli("export", "-o", "w.safetensors")
    assert "3 plain values left out" in result.stderr
    assert "left out" not in cli("export", "-o", "w.pt").stderr


def test_anyones_text_reaches_the_terminal_escaped(cli, tmp_path):
    # a commit's message and record are anyone's text (a fetched commit): raw, an escape sequence
    # retitles the terminal, clears it or moves the cursor over what mvc printed
    import json
    import torch
    torch.save({"w": torch.ones(3)}, tmp_path / "a.pt")
    message = "evil \x1b]0;TITLE\x07\x1b[2J\u2028next"
    cli("commit", tmp_path / "a.pt", "-m", message, "--metric", "lo\x1bss=1")
    for args in (("log",), ("show",), ("log", "--oneline")):
        out = cli(*args).output
        assert "\x1b" not in out and "\x07" not in out and "\u2028" not in out, args
        assert "\\x1b" in out, args
    assert json.loads(cli("log", "--json").output)[0]["message"] == message  # data keeps the bytes
    assert "\x1b" not in cli("show", "\x1b[2J", code=1).stderr  # an error that quotes the input
