"""Every ``mvc`` subcommand, found by walking click's command tree, given odd and missing input.

Whatever it is given, a command never prints a Python traceback and never
ends in an unexpected exception (exit 70); input that cannot be right
(an unknown option, a missing argument) exits non-zero.
"""

import click
import pytest
import torch
from click.testing import CliRunner

import mvc
from mvc.cli import main
from mvc.cli.base import BUG

ODD = ["", "-1", "no-such-rev", "..", "x" * 300, "é\x01", "HEAD~999", "0"]
NEVER = {("serve",)}  # commands that run until stopped


def commands(group=main, path=()):
    for name, cmd in sorted(group.commands.items()):
        if isinstance(cmd, click.Group):
            yield from commands(cmd, path + (name,))
        elif path + (name,) not in NEVER:
            yield path + (name,), cmd


def invocations(cmd) -> list:
    """Argument lists: none; an unknown option; every argument odd; each option given an odd value."""
    args = [p for p in cmd.params if isinstance(p, click.Argument)]
    options = [p for p in cmd.params if isinstance(p, click.Option) and not p.is_flag and p.nargs == 1
               and not p.count]
    out = [([], False), (["--no-such-option"], True)]
    for odd in ODD:
        out.append(([odd] * max(1, len(args)), False))
    for opt in options:
        for odd in ("", "-1", "x" * 300):
            out.append(([opt.opts[-1], odd], False))
        out.append(([opt.opts[-1]], True))  # an option that wants a value, given none
    return out


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """A repository with two commits, inside two folders of its own (so '..' stays in tmp)."""
    root = tmp_path_factory.mktemp("every") / "w" / "r"
    repo = mvc.Repository.init(root, chunk_size=64)
    repo.commit({"w": torch.arange(100.0)}, "one")
    repo.commit({"w": torch.arange(100.0) * 2}, "two")
    repo.close()
    return root


@pytest.mark.parametrize("path,cmd", list(commands()), ids=lambda x: " ".join(x) if isinstance(x, tuple) else "")
def test_no_traceback_whatever_the_input(path, cmd, workdir, monkeypatch):
    monkeypatch.chdir(workdir)
    monkeypatch.delenv("MVC_TRACEBACK", raising=False)
    runner = CliRunner()
    for extra, bad in invocations(cmd):
        result = runner.invoke(main, [*path, *extra], input="")
        where = (path, extra, result.exit_code, result.output[-400:])
        assert "Traceback" not in result.output, where
        assert result.exception is None or isinstance(result.exception, SystemExit), (where, repr(result.exception))
        assert result.exit_code != BUG, where
        if bad:
            assert result.exit_code != 0, where


def test_an_unexpected_exception_is_one_line_and_exit_70(workdir, monkeypatch):
    """A bug (here: an exception mvc never raises on purpose) is named in one line, exit 70."""
    monkeypatch.chdir(workdir)
    monkeypatch.delenv("MVC_TRACEBACK", raising=False)

    def broken(self, *args, **kwargs):
        raise ZeroDivisionError("injected")
    monkeypatch.setattr(mvc.Repository, "status", broken)
    result = CliRunner().invoke(main, ["status"])
    assert result.exit_code == BUG and result.exception is not None and type(result.exception) is SystemExit
    assert "Traceback" not in result.output and result.stderr.count("\n") == 1
    assert "ZeroDivisionError" in result.stderr and "report" in result.stderr


def test_the_cli_adds_fsck_advice_the_library_leaves_out(workdir, monkeypatch, tmp_path):
    """A missing pack: the library's error names the pack (type and attribute), the CLI says what to run."""
    import shutil
    from mvc.errors import PackMissing
    copy = tmp_path / "copy"
    shutil.copytree(workdir / ".mvc", copy / ".mvc")
    for pack in (copy / ".mvc" / "packs").glob("*.pack"):
        pack.unlink()
    repo = mvc.Repository.open(copy)
    with pytest.raises(PackMissing) as err:
        repo.load()
    assert "mvc fsck" not in str(err.value) and err.value.pack.endswith(".pack")
    repo.close()
    monkeypatch.chdir(copy)
    result = CliRunner().invoke(main, ["export", "HEAD", "-o", str(tmp_path / "x.pt")])
    assert result.exit_code == 1 and "run 'mvc fsck'" in result.stderr and "Traceback" not in result.output


def test_a_refusal_force_overrides_says_force_true_in_the_library_and_force_in_the_cli(tmp_path):
    """repo.create_tag on a protected tag said "pass --force to move it" to a Python caller."""
    from mvc.cli.base import advice
    repo = mvc.Repository.init(tmp_path)
    repo.commit({"w": torch.zeros(2)}, "one")
    repo.commit({"w": torch.ones(2)}, "two")
    repo.create_tag("best", "main", protect=True)
    with pytest.raises(mvc.ProtectedRef) as err:
        repo.create_tag("best", "main~1")
    assert "--" not in str(err.value) and str(err.value).endswith("; force=True would move it")
    assert (err.value.ref, err.value.action, err.value.forced) == ("tags/best", "move", "move it")
    assert advice(err.value) == "tag 'best' is protected; pass --force to move it"
    result = CliRunner().invoke(main, ["-C", str(tmp_path), "tag", "best", "main~1"])
    assert result.exit_code == 1 and result.stderr == "mvc: error: tag 'best' is protected; pass --force to move it\n"
    exported = CliRunner().invoke(main, ["-C", str(tmp_path), "export", "-o", str(tmp_path / "x.pt")])
    assert exported.exit_code == 0
    again = CliRunner().invoke(main, ["-C", str(tmp_path), "export", "-o", str(tmp_path / "x.pt")])
    assert again.stderr == f"mvc: error: {tmp_path / 'x.pt'} already exists; pass --force to overwrite it\n"
    repo.close()


@pytest.mark.parametrize("error, hint", [
    (lambda E: E.UnknownRemote("no remote named 'up'", name="up"), "add it with 'mvc remote add up URL'"),
    (lambda E: E.UnknownRemote("several remotes", known=("a", "b")), None),
    (lambda E: E.RemoteExists("remote 'up' already exists", name="up"), "'mvc remote remove up'"),
    (lambda E: E.NotConfigured("no remote is cached", setting="cache.remote"), "'mvc config cache.remote VALUE'"),
    (lambda E: E.RefRejected("rejected", remote="up", refs=("heads/main",)), "'mvc fetch up'"),
    (lambda E: E.Diverged("diverged", branch="b", remote="up"), "'mvc branch --force b up/b'"),
    (lambda E: E.Diverged("diverged", branch="b", remote="up"), "'mvc merge b up/b -b b'"),
    (lambda E: E.RefExists("exists", ref="heads/exp", action="create-and-checkout"), "'mvc checkout exp'"),
    (lambda E: E.ProtectedRef("protected", ref="heads/main", action="commit"), "'mvc branch --unprotect main'"),
    (lambda E: E.ProtectedRef("protected; pass --force to move it", ref="tags/v1", action="move"), None),
    (lambda E: E.BranchLocked("locked", branch="main", owner="alice", named=True), "ask alice to run 'mvc unlock main' (or run 'mvc unlock main --owner alice' for them)"),
    (lambda E: E.BranchLocked("locked", branch="main", here=False), "'mvc unlock --force main'"),
    (lambda E: E.BranchLocked("locked", branch="main", remote="up", named=True), "'mvc remote unlock up main'"),
    (lambda E: E.LockDamaged("damaged", branch="main"), "'mvc unlock --force main'"),
    (lambda E: E.LockDamaged("damaged", branch="main", remote="up"), "'mvc remote unlock --force up main'"),
    (lambda E: E.HeadMissing("HEAD is missing"), "'mvc checkout BRANCH'"),
    (lambda E: E.NoBisect("no bisect in progress"), "'mvc bisect start BAD GOOD'"),
    (lambda E: E.BisectInProgress("in progress"), "'mvc bisect reset'"),
    (lambda E: E.BisectFinished("finished"), "'mvc bisect reset'"),
    (lambda E: E.BisectStopped("stopped", code=3), "'mvc bisect run' again"),
    (lambda E: E.BisectStateDamaged("damaged"), "'mvc bisect reset' and start again"),
    (lambda E: E.BisectEndMisjudged("the good end is bad", expected="good", verdict="bad", metric="loss", value=0.8),
     "check --threshold and --higher-is-worse, or if that end is wrong run 'mvc bisect reset'"),
    (lambda E: E.BisectEndMisjudged("the good end exited with 1", expected="good", verdict="bad", code=1),
     "fix the command, or if that end is wrong run 'mvc bisect reset'"),
    (lambda E: E.VerdictContradicts("contradicts", verdict="good"), "'mvc bisect log'"),
    (lambda E: E.RemoteDamaged("damaged", remote="up", ids=(b"\1" * 32,)), "'mvc fsck --remote up'"),
    (lambda E: E.RemoteCorrupt("corrupt", key="packs/x.pack", id=b"\1" * 32), "'mvc fsck --remote'"),
    (lambda E: E.WalkDamaged("gc stopped", kind="corrupt-reflog"), "'mvc reflog expire --damaged'"),
    (lambda E: E.WalkDamaged("gc stopped", kind="missing-tree", id=b"\1" * 32), "--prune-lost"),
    (lambda E: E.ChecksumMismatch("corrupt", id=b"\1" * 32), "run 'mvc fsck'"),
    (lambda E: E.CommitPruned("pruned", id=b"\1" * 32), None),
    (lambda E: E.CorruptObject("a setting is damaged"), None),  # no stored object named: fsck would not find it
])
def test_the_cli_adds_the_command_to_run(error, hint):
    """The library's message says what went wrong; the CLI (base.advice) adds what to run, by class and attributes."""
    from mvc import errors
    from mvc.cli.base import advice
    exc = error(errors)
    assert "'mvc " not in str(exc)
    said = advice(exc)
    assert said.startswith(str(exc))
    if hint is None:
        assert said == str(exc)
    else:
        assert hint in said and said.count("; ") == str(exc).count("; ") + 1
