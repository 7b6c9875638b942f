"""OpenSSF model signing (mvc.oms) against the reference tool, ``model_signing`` from PyPI.

mvc signs an exported model folder and the reference tool's ``verify key``
accepts it, and refuses it after one flipped byte or a renamed file; mvc
checks a folder that ``model_signing sign key`` signed and refuses it
tampered. Both run offline with a local EC key.
"""

import base64
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import mvc
from mvc import oms
from mvc.errors import ModelSignatureError

from conftest import run_cli
from damage import flip_bit

pytest.importorskip("cryptography")
TOOL = [sys.executable, "-c", "from model_signing._cli import main; main()"]


def reference(*args) -> subprocess.CompletedProcess:
    """``model_signing ARGS``, the OpenSSF reference tool, in a process of its own."""
    return subprocess.run([*TOOL, *map(str, args)], capture_output=True, text=True, timeout=120)


def keypair(where: Path, name: str = "key") -> tuple:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    key = ec.generate_private_key(ec.SECP256R1())
    private, public = where / f"{name}.pem", where / f"{name}.pub"
    private.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    public.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                     serialization.PublicFormat.SubjectPublicKeyInfo))
    return private, public


@pytest.fixture
def folder_commit(tmp_path):
    """A repository whose main is a model folder commit (two shards in a subfolder, configs)."""
    from safetensors.torch import save_file
    source = tmp_path / "hf"
    (source / "sub").mkdir(parents=True)
    torch.manual_seed(0)
    save_file({"w": torch.randn(64, 8), "b": torch.zeros(8)}, source / "model.safetensors")
    save_file({"e": torch.randn(16, 4)}, source / "sub" / "extra.safetensors")
    (source / "config.json").write_text(json.dumps({"hidden_size": 8}))
    (source / "tokenizer.json").write_text("{}")
    repo = mvc.Repository.init(tmp_path / "repo", chunk_size=4096)
    commit = repo.commit_file(source)
    repo.close()
    return tmp_path / "repo", commit


def test_the_reference_tool_accepts_mvcs_signature_and_refuses_a_flipped_byte_or_a_renamed_file(
        folder_commit, tmp_path):
    root, commit = folder_commit
    private, public = keypair(tmp_path)
    out = tmp_path / "signed"
    result = run_cli(root, "export", "main", "-o", out, "--sign", private)
    assert result.exit_code == 0, result.output
    assert "signed its 4 files" in result.stdout
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()) == [
        "config.json", "model.safetensors", "model.sig", "sub/extra.safetensors", "tokenizer.json"]
    envelope = json.loads((out / "model.sig").read_text())["dsseEnvelope"]
    payload = json.loads(base64.b64decode(envelope["payload"]))
    assert payload["predicate"]["mvc"] == {"commit": commit.id}
    ok = reference("verify", "key", "--public_key", public, "--signature", out / "model.sig", out)
    assert ok.returncode == 0 and "Verification succeeded" in ok.stdout, ok.stdout + ok.stderr
    said = run_cli(root, "verify-model", out, "--key", public)
    assert said.exit_code == 0 and f"mvc commit {commit.id}" in said.stdout

    flip_bit(out / "sub" / "extra.safetensors", 200)
    bad = reference("verify", "key", "--public_key", public, "--signature", out / "model.sig", out)
    assert bad.returncode != 0 and "Verification succeeded" not in bad.stdout
    with pytest.raises(ModelSignatureError) as err:
        oms.verify_folder(out, public)
    assert err.value.problem == "digest-mismatch" and err.value.file == "sub/extra.safetensors"
    flip_bit(out / "sub" / "extra.safetensors", 200)  # back as signed
    assert oms.verify_folder(out, public).commit == commit.id

    (out / "config.json").rename(out / "config2.json")
    bad = reference("verify", "key", "--public_key", public, "--signature", out / "model.sig", out)
    assert bad.returncode != 0 and "Verification succeeded" not in bad.stdout
    with pytest.raises(ModelSignatureError) as err:
        oms.verify_folder(out, public)
    assert err.value.problem == "missing-file" and err.value.file == "config.json"
    said = run_cli(root, "verify-model", out, "--key", public)
    assert said.exit_code == 1 and "config.json was signed but is not in" in said.stderr


def test_mvc_verifies_what_the_reference_tool_signed_and_refuses_it_tampered(folder_commit, tmp_path):
    root, _ = folder_commit
    private, public = keypair(tmp_path)
    out = tmp_path / "plain"
    assert run_cli(root, "export", "main", "-o", out).exit_code == 0
    signed = reference("sign", "key", "--private_key", private, "--signature", out / "model.sig", out)
    assert signed.returncode == 0, signed.stdout + signed.stderr
    result = oms.verify_folder(out, public)
    assert (result.files, result.commit, result.name) == (4, None, "plain")
    assert "no mvc commit named" in run_cli(root, "verify-model", out, "--key", public).stdout

    (out / "notes.txt").write_text("added after signing")
    with pytest.raises(ModelSignatureError) as err:
        oms.verify_folder(out, public)
    assert (err.value.problem, err.value.file) == ("extra-file", "notes.txt")
    (out / "notes.txt").unlink()
    flip_bit(out / "model.safetensors", 300)
    with pytest.raises(ModelSignatureError) as err:
        oms.verify_folder(out, public)
    assert (err.value.problem, err.value.file) == ("digest-mismatch", "model.safetensors")
    flip_bit(out / "model.safetensors", 300)
    _, other = keypair(tmp_path, "other")
    with pytest.raises(ModelSignatureError) as err:
        oms.verify_folder(out, other)
    assert err.value.problem == "bad-signature"


def test_an_edited_statement_or_a_missing_signature_is_refused(folder_commit, tmp_path):
    root, commit = folder_commit
    private, public = keypair(tmp_path)
    out = tmp_path / "signed"
    assert run_cli(root, "export", "main", "-o", out, "--sign", private).exit_code == 0
    sig = out / "model.sig"
    bundle = json.loads(sig.read_text())
    statement = json.loads(base64.b64decode(bundle["dsseEnvelope"]["payload"]))
    statement["predicate"]["mvc"]["commit"] = "0" * 64  # claim another commit
    bundle["dsseEnvelope"]["payload"] = base64.b64encode(json.dumps(statement).encode()).decode()
    sig.write_text(json.dumps(bundle))
    with pytest.raises(ModelSignatureError) as err:
        oms.verify_folder(out, public)
    assert err.value.problem == "bad-signature"
    sig.unlink()
    with pytest.raises(ModelSignatureError) as err:
        oms.verify_folder(out, public)
    assert err.value.problem == "no-signature"


def test_a_commit_that_is_not_a_folder_is_signed_as_model_safetensors(tmp_path):
    from safetensors.torch import load_file
    repo = mvc.Repository.init(tmp_path / "repo", chunk_size=64)
    commit = repo.commit({"model": {"w": torch.arange(12.0)}, "step": 3}, "train")
    repo.close()
    private, public = keypair(tmp_path)
    out = tmp_path / "signed"
    assert run_cli(tmp_path / "repo", "export", "HEAD", "-o", out, "--sign", private).exit_code == 0
    assert sorted(p.name for p in out.iterdir()) == ["model.safetensors", "model.sig"]
    assert torch.equal(load_file(out / "model.safetensors")["model.w"], torch.arange(12.0))
    assert oms.verify_folder(out, public).commit == commit.id
    ok = reference("verify", "key", "--public_key", public, "--signature", out / "model.sig", out)
    assert ok.returncode == 0, ok.stdout + ok.stderr


def test_bad_keys_and_busy_folders_are_refused_before_anything_is_written(folder_commit, tmp_path):
    root, _ = folder_commit
    (tmp_path / "not-a-key.pem").write_text("hello")
    result = run_cli(root, "export", "main", "-o", tmp_path / "out", "--sign", tmp_path / "not-a-key.pem")
    assert result.exit_code == 1 and "cannot read the private key" in result.stderr
    assert not (tmp_path / "out").exists()
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519
    (tmp_path / "ed.pem").write_bytes(ed25519.Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    result = run_cli(root, "export", "main", "-o", tmp_path / "out", "--sign", tmp_path / "ed.pem")
    assert result.exit_code == 1 and "not an EC key" in result.stderr
    private, _ = keypair(tmp_path)
    result = run_cli(root, "export", "main", "-o", tmp_path / "out", "--sign", private, "--only", "w")
    assert result.exit_code == 2
    result = run_cli(root, "export", "main", "-o", tmp_path / "out.safetensors", "--sign", private)
    assert result.exit_code == 1 and "give a folder name" in result.stderr
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    with mvc.Repository.open(tmp_path / "repo") as repo:
        plain = repo.commit({"w": torch.ones(3)}, "not a folder")
    result = run_cli(root, "export", plain.id, "-o", tmp_path / "busy", "--sign", private)
    assert result.exit_code == 1 and "notes.txt" in result.stderr and not (tmp_path / "busy" / "model.sig").exists()


def test_a_bundle_or_statement_of_another_shape_is_malformed_not_a_crash(tmp_path):
    """A key hint that is not text (the bundle's unsigned part: anyone may write it), JSON nested
    past the recursion limit, or a signed statement whose serialization is no map: each was an
    internal error (TypeError, RecursionError, AttributeError) instead of a malformed signature."""
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    private, public = keypair(tmp_path)
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "a.txt").write_text("hi")
    oms.sign_folder(folder, private)
    sig = folder / "model.sig"
    good = json.loads(sig.read_text())
    key = serialization.load_pem_private_key(private.read_bytes(), None)

    def signed(statement: dict) -> dict:
        payload = json.dumps(statement).encode()
        bundle = json.loads(json.dumps(good))
        bundle["dsseEnvelope"]["payload"] = base64.b64encode(payload).decode()
        bundle["dsseEnvelope"]["signatures"][0]["sig"] = base64.b64encode(
            key.sign(oms.pae(payload), ec.ECDSA(hashes.SHA256()))).decode()
        return bundle
    statement = json.loads(base64.b64decode(good["dsseEnvelope"]["payload"]))
    hint = json.loads(json.dumps(good))
    hint["verificationMaterial"]["publicKey"]["hint"] = 5
    for bundle in (hint, "[" * 100_000 + "]" * 100_000,
                   signed({**statement, "predicate": {**statement["predicate"], "serialization": []}}),
                   signed({**statement, "predicate": {**statement["predicate"], "serialization": {
                       **statement["predicate"]["serialization"], "ignore_paths": 5}}})):
        sig.write_text(bundle if isinstance(bundle, str) else json.dumps(bundle))
        with pytest.raises(ModelSignatureError) as err:
            oms.verify_folder(folder, public)
        assert err.value.problem == "malformed"
    sig.write_text(json.dumps(signed(statement)))  # the same statement re-signed verifies
    assert oms.verify_folder(folder, public).files == 1


def test_a_fifo_or_socket_in_the_folder_is_refused_not_waited_on(folder_commit, tmp_path, monkeypatch):
    import os
    import socket
    root, _ = folder_commit
    private, public = keypair(tmp_path)
    out = tmp_path / "signed"
    assert run_cli(root, "export", "main", "-o", out, "--sign", private).exit_code == 0
    os.mkfifo(out / "pipe")  # opening it to read would wait for a writer forever
    done = subprocess.run([sys.executable, "-m", "mvc", "verify-model", str(out), "--key", str(public)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "pipe is not a regular file" in done.stderr, done.stderr
    (out / "pipe").unlink()
    monkeypatch.chdir(out)  # a socket's path must be short
    with socket.socket(socket.AF_UNIX) as s:
        s.bind("sock")
        for act in (lambda: oms.verify_folder(out, public), lambda: oms.sign_folder(out, private)):
            with pytest.raises(ModelSignatureError) as err:
                act()
            assert (err.value.problem, err.value.file) == ("not-a-file", "sock")


def test_signing_through_a_branch_link_that_moves_signs_the_commit_it_names(tmp_path, monkeypatch):
    import os
    mnt = tmp_path / "mnt"  # laid out as a mount: a branch is a link to commits/<id>
    old, new = "a" * 64, "b" * 64
    for cid, text in ((old, "old weights"), (new, "new weights")):
        (mnt / "commits" / cid).mkdir(parents=True)
        (mnt / "commits" / cid / "model.safetensors").write_text(text)
    os.symlink(f"commits/{old}", mnt / "main")
    private, public = keypair(tmp_path)
    hashed = oms.file_digest

    def branch_moves_mid_signing(*args):
        if os.readlink(mnt / "main") != f"commits/{new}":
            os.remove(mnt / "main")
            os.symlink(f"commits/{new}", mnt / "main")
        return hashed(*args)
    monkeypatch.setattr(oms, "file_digest", branch_moves_mid_signing)
    out = run_cli(tmp_path, "sign-model", mnt / "main", "--key", private, "--signature", tmp_path / "m.sig")
    assert out.exit_code == 0, out.output
    monkeypatch.setattr(oms, "file_digest", hashed)
    result = oms.verify_folder(mnt / "commits" / old, public, tmp_path / "m.sig")  # the files it names, signed
    assert result.commit == old


def test_sign_model_names_only_a_full_commit_id(tmp_path):
    private, public = keypair(tmp_path)
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    for wrong in ("main", "3f2a9c1d0b7e", "Z" * 64):  # a branch, a short id, not hex: verify-model would echo it
        out = run_cli(tmp_path, "sign-model", folder, "--key", private, "--commit", wrong)
        assert out.exit_code == 2 and "full commit id" in out.stderr, out.output
        assert not (folder / "model.sig").exists()
    fake = tmp_path / "commits" / ("x" * 64)  # a folder named like a mount's, but no commit id
    fake.mkdir(parents=True)
    assert run_cli(tmp_path, "sign-model", fake, "--key", private).exit_code == 0
    assert oms.verify_folder(fake, public).commit is None
