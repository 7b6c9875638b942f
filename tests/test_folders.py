"""Model folder commits (mvc/folders.py): hidden files are said, .mvcignore leaves files out."""

import json

import pytest
import torch
from safetensors.torch import save_file

import mvc
from conftest import run_cli


def folder_with_secrets(path):
    """A model folder that also holds what a careless copy of a home folder would: keys and tokens."""
    path.mkdir(parents=True, exist_ok=True)
    save_file({"w": torch.arange(12.0).reshape(3, 4)}, path / "model.safetensors")
    (path / "config.json").write_text('{"hidden_size": 4}')
    (path / ".gitattributes").write_text("*.safetensors filter=lfs\n")  # usual in a hub download: no secret
    (path / ".ssh").mkdir()
    (path / ".ssh" / "id_ed25519").write_text("-----BEGIN OPENSSH PRIVATE KEY-----\n")
    (path / ".env").write_text("HF_TOKEN=hf_secret\n")
    (path / "sub" / ".aws").mkdir(parents=True)
    (path / "sub" / ".aws" / "credentials").write_text("[default]\n")
    return path


def test_hidden_files_a_folder_commit_stores_are_reported(repo, tmp_path):
    """.ssh/* went into the commit without a word."""
    folder = folder_with_secrets(tmp_path / "hf")
    c = repo.commit_file(folder)
    assert c.hidden == (".env", ".ssh/id_ed25519", "sub/.aws/credentials")
    files = repo.load(c.id)["__folder__"]["files"]
    assert ".ssh/id_ed25519" in files and ".gitattributes" in files  # stored as the folder holds them, and said
    r = run_cli(repo, "commit", folder, "-m", "again")
    assert r.exit_code == 0, r.output
    assert ("warning: this commit holds the folder's hidden files (or files linked from outside it) .env, "
            ".ssh/id_ed25519, sub/.aws/credentials; "
            f"to leave them out, list them in {folder}/.mvcignore") in r.stderr
    assert json.loads(run_cli(repo, "commit", folder, "--json").stdout)["hidden"] == list(c.hidden)


def test_a_file_linked_from_outside_the_folder_is_reported(repo, tmp_path):
    """tokenizer.model -> ~/.ssh/id_ed25519 went in as a model file without a word; a hub cache
    snapshot's links into its blobs/ are what a snapshot is made of, and are not reported."""
    secret = tmp_path / "home" / ".ssh" / "id_ed25519"
    secret.parent.mkdir(parents=True)
    secret.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\n")
    blob = tmp_path / "hub" / "blobs" / "abc123"
    blob.parent.mkdir(parents=True)
    blob.write_text('{"hidden_size": 4}')
    folder = tmp_path / "hub" / "snapshots" / "main"
    folder.mkdir(parents=True)
    save_file({"w": torch.ones(2)}, folder / "model.safetensors")
    (folder / "config.json").symlink_to(blob)
    (folder / "tokenizer.model").symlink_to(secret)
    (folder / "inside.json").symlink_to(folder / "config.json")
    c = repo.commit_file(folder)
    assert c.hidden == ("tokenizer.model",)


def test_mvcignore_leaves_out_what_it_names_and_says_so(repo, tmp_path):
    folder = folder_with_secrets(tmp_path / "hf")
    (folder / ".mvcignore").write_text("# secrets stay home\n.ssh/\n.env\n\nsub/.aws/credentials\n")
    c = repo.commit_file(folder)
    assert c.hidden == () and c.left_out == (".ssh/", ".env", "sub/.aws/credentials")
    files = repo.load(c.id)["__folder__"]["files"]
    assert sorted(files) == [".gitattributes", ".mvcignore", "config.json"]
    r = run_cli(repo, "commit", folder)
    assert r.exit_code == 0 and "warning" not in r.stderr and "left out of the model folder: .ssh/" in r.stderr
    out = tmp_path / "out"
    assert run_cli(repo, "export", "HEAD", "-o", out).exit_code == 0
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()) == \
        [".gitattributes", ".mvcignore", "config.json", "model.safetensors"]


@pytest.mark.parametrize("lines,left", [("*.key\n", ["a.key", "deep/b.key"]), ("deep/\n", ["deep/"]),
                                        ("/deep/b.key\n", ["deep/b.key"]), ("deep\n", ["deep/"]),
                                        # Git's leading **/ matches at the root too: '**/*.key' left out
                                        # deep/b.key but committed ./a.key, a secret the rule names
                                        ("**/*.key\n", ["a.key", "deep/b.key"]), ("**/b.key\n", ["deep/b.key"]),
                                        ("**/deep/\n", ["deep/"]), ("**/deep/b.key\n", ["deep/b.key"])])
def test_mvcignore_globs_match_names_at_any_depth_or_paths_from_the_root(repo, tmp_path, lines, left):
    folder = tmp_path / "hf"
    (folder / "deep").mkdir(parents=True)
    save_file({"w": torch.ones(2)}, folder / "model.safetensors")
    (folder / "a.key").write_text("k")
    (folder / "deep" / "b.key").write_text("k")
    (folder / ".mvcignore").write_text(lines)
    c = repo.commit_file(folder)
    assert sorted(c.left_out) == left
    files = set(repo.load(c.id)["__folder__"]["files"])
    assert {"a.key", "deep/b.key"} & files == {"a.key", "deep/b.key"} - set(left) - {"deep/"} - (
        {"deep/b.key"} if "deep/" in left else set())


def test_an_unreadable_mvcignore_is_a_clear_error(repo, tmp_path):
    folder = tmp_path / "hf"
    folder.mkdir()
    save_file({"w": torch.ones(2)}, folder / "model.safetensors")
    (folder / ".mvcignore").write_bytes(b"\xff\xfe not text")
    with pytest.raises(mvc.BadInput, match=".mvcignore"):
        repo.commit_file(folder)
