"""Signed commits and tags (mvc/signing.py, mvc/audit.py): golden bytes, good / bad /
unknown / unsigned verdicts, flipped bytes, allowed signers, keys, policy, CLI."""

import shutil
import subprocess
from dataclasses import replace

import pytest
import torch

import mvc
from mvc import signing
from mvc.errors import BadAllowedSigners, CorruptObject, SignatureRequired, SigningKeyError
from mvc.objects import CommitObject, TagObject, object_id

from conftest import run_cli

SEED = bytes(range(32, 64))  # the fixed test key: Ed25519 signatures are deterministic
PUBLIC = "29acbae141bccaf0b22e1a94d34d0bc7361e526d0bfe12c89794bc9322966dd7"
RAW_SIGNATURE = ("ae662044cbdbadacfecc10c63d22622c360d8c15754e7e9f2545409a7973bdee"
                 "eeac168a88c4482da4f84f82f6249199894cc25617b07c84da176f262631a304")
SSHSIG_HEX = (
    "535348534947" "00000001"                                    # "SSHSIG", version 1
    "00000033" "0000000b" + b"ssh-ed25519".hex() + "00000020" + PUBLIC +  # public key
    "00000003" + b"mvc".hex() +                                  # namespace "mvc"
    "00000000"                                                   # reserved
    "00000006" + b"sha512".hex() +                               # hash algorithm
    "00000053" "0000000b" + b"ssh-ed25519".hex() + "00000040" + RAW_SIGNATURE
)
# the golden commit of tests/test_golden.py, whose bytes are pinned there (COMMIT_HEX)
UNSIGNED_HEX = (
    "8a" "a6617574686f72a861646140686f7374" "a7636f6e7465787483a26c72cb3f33a92a30553261a47365656400a47461677391a161"
    "a565706f636802" "a76d657373616765a4696e6974" "a76d65747269637382a46c6f7373cb3fd0000000000000a6746f6b656e73cd1000"
    "a7706172656e747391c420" + "ff" * 32 + "a47374657064" "a474696d65cf00060a2418202240"
    "a474726565c420" + bytes(range(32)).hex() + "a474797065a6636f6d6d6974"
)


def golden_commit(signature: bytes = b"") -> CommitObject:
    return CommitObject(bytes(range(32)), (b"\xff" * 32,), "init", "ada@host", 1_700_000_000_123_456, 100, 2,
                        {"loss": 0.25, "tokens": 4096}, {"lr": 0.0003, "seed": 0, "tags": ["a"]}, signature)


@pytest.fixture
def key():
    return signing.key_from_seed(SEED)


@pytest.fixture
def signed_repo(repo, key, tmp_path):
    """A repository whose allowed signers file lists the test key as ada@example.com."""
    (tmp_path / "allowed_signers").write_text(f"ada@example.com {key.public_line('test key')}\n")
    repo.config(signing.ALLOWED, "allowed_signers")
    return repo


def other_key():
    return signing.key_from_seed(b"\x07" * 32)


# -- format ---------------------------------------------------------------------

def test_unsigned_commit_bytes_are_unchanged_and_are_the_payload():
    c = golden_commit()
    assert c.encode().hex() == UNSIGNED_HEX == c.payload().hex()


def test_golden_bytes_of_a_signed_commit(key):
    sig = signing.sign(key, golden_commit().payload())
    assert sig.hex() == SSHSIG_HEX
    data = golden_commit(sig).encode()
    # one more field (0x8b), "signature" (bin 8, 173 bytes) sorted between "parents" and "step"
    at = UNSIGNED_HEX.index("a47374657064")
    assert data.hex() == "8b" + UNSIGNED_HEX[2:at] + "a9" + b"signature".hex() + "c4ad" + SSHSIG_HEX + UNSIGNED_HEX[at:]
    assert object_id(data).hex() == "8eea1cba27b9f5deed762cf59a36cb83af583cfc8f917e577894441cb9d2667f"
    assert CommitObject.decode(data) == golden_commit(sig)


@pytest.mark.parametrize("value", [b"", "text", 5, b"x" * (8 << 10 + 1)])
def test_a_commit_with_a_bad_signature_field_is_corrupt(value):
    fields = CommitObject.decode(bytes.fromhex(UNSIGNED_HEX))._fields()
    from mvc import encoding
    with pytest.raises(CorruptObject):
        CommitObject.decode(encoding.pack({**fields, "signature": value}))


@pytest.mark.skipif(shutil.which("ssh-keygen") is None, reason="needs OpenSSH's ssh-keygen")
def test_ssh_keygen_verifies_mvc_signatures_and_makes_the_same_bytes(key, tmp_path):
    payload = golden_commit().payload()
    (tmp_path / "payload").write_bytes(payload)
    (tmp_path / "payload.sig").write_text(signing.armor(signing.sign(key, payload)))
    (tmp_path / "allowed").write_text(f"ada@example.com {key.public_line()}\n")
    verify = subprocess.run(["ssh-keygen", "-Y", "verify", "-f", "allowed", "-I", "ada@example.com", "-n", "mvc",
                             "-s", "payload.sig"], stdin=open(tmp_path / "payload", "rb"), cwd=tmp_path,
                            capture_output=True, text=True)
    assert verify.returncode == 0, verify.stderr
    # and the other way: a key file ssh-keygen made, its signature read by mvc
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", "k"], cwd=tmp_path, check=True)
    (tmp_path / "payload.sig").unlink()
    subprocess.run(["ssh-keygen", "-Y", "sign", "-f", "k", "-n", "mvc", "payload"], cwd=tmp_path, check=True,
                   capture_output=True)
    blob = signing.dearmor((tmp_path / "payload.sig").read_text())
    theirs = signing.load_key(tmp_path / "k")
    assert blob == signing.sign(theirs, payload)
    allowed = signing.parse_allowed_signers(f"bob {theirs.public_line()}")
    assert signing.verify(blob, payload, allowed).status == "good"


# -- verdicts through the repository ------------------------------------------------

def test_sign_and_verify_round_trip(signed_repo, key):
    c = signed_repo.commit({"w": torch.arange(40.0)}, "signed", sign=key)
    v = signed_repo.trust.verify_commit(c.id)
    assert (v.status, v.principal, v.key) == ("good", "ada@example.com", key.fingerprint)
    assert signed_repo.load(c.id)["w"].equal(torch.arange(40.0))
    u = signed_repo.commit({"w": torch.arange(41.0)}, "plain")
    assert signed_repo.trust.verify_commit(u.id).status == "unsigned"
    assert "signatures" in (signed_repo.dir / "FORMAT").read_text()
    assert signed_repo.fsck().ok


def test_unknown_key_and_no_allowed_signers_are_unknown(repo, signed_repo, key):
    c = signed_repo.commit({"w": torch.zeros(3)}, sign=other_key())
    v = signed_repo.trust.verify_commit(c.id)
    assert v.status == "unknown" and v.key == other_key().fingerprint and v.principal is None
    repo.config(signing.ALLOWED, unset=True)
    assert repo.trust.verify_commit(c.id).status == "unknown"


def _forge(repo, oid: bytes, data: bytes) -> None:
    """Replace commit ``oid``'s stored bytes (the index holds no checksum of its own)."""
    with repo.index.write() as txn:
        txn.delete("commits", oid)
        txn.put("commits", oid, data)


def test_a_flipped_byte_in_the_stored_signed_commit_is_bad(signed_repo, key):
    c = signed_repo.commit({"w": torch.zeros(3)}, "deploy me", sign=key)
    oid = bytes.fromhex(c.id)
    with signed_repo.index.read() as txn:
        data = txn.get("commits", oid)
    for at in (5, len(data) // 2, data.index(b"SSHSIG") + 40, len(data) - 1):
        flipped = bytearray(data)
        flipped[at] ^= 0x01
        _forge(signed_repo, oid, bytes(flipped))
        v = signed_repo.trust.verify_commit(c.id)
        assert v.status == "bad", at
    _forge(signed_repo, oid, data)
    assert signed_repo.trust.verify_commit(c.id).status == "good"


def test_every_flipped_byte_of_a_signature_is_bad_even_under_a_recomputed_id(key):
    allowed = signing.parse_allowed_signers(f"ada {key.public_line()}")
    good = golden_commit(signing.sign(key, golden_commit().payload()))
    assert signing.verify(good.signature, good.payload(), allowed).status == "good"
    for at in range(len(good.signature)):
        sig = bytearray(good.signature)
        sig[at] ^= 0x40
        forged = replace(good, signature=bytes(sig))
        data = forged.encode()  # a forger recomputes the id: the hash chain alone cannot tell
        verdict, _ = mvc.audit.verify_commit_bytes(object_id(data), data, allowed)
        assert verdict.status == "bad", at


def test_a_changed_record_under_a_recomputed_id_is_bad(key):
    allowed = signing.parse_allowed_signers(f"ada {key.public_line()}")
    good = golden_commit(signing.sign(key, golden_commit().payload()))
    for forged in (replace(good, metrics={"loss": 0.24, "tokens": 4096}), replace(good, message="init!"),
                   replace(good, parents=(b"\xfe" * 32,)), replace(good, time=good.time + 1)):
        data = forged.encode()
        assert mvc.audit.verify_commit_bytes(object_id(data), data, allowed)[0].status == "bad"


def test_signed_tags(signed_repo, key):
    c = signed_repo.commit({"w": torch.zeros(3)})
    signed_repo.create_tag("v1", sign=key, message="release 1")
    v = signed_repo.trust.verify_tag("v1")
    assert (v.status, v.target, v.message, v.principal) == ("good", c.id, "release 1", "ada@example.com")
    signed_repo.create_tag("v1", "HEAD")  # re-tagging the same commit keeps the signature
    assert signed_repo.trust.verify_tag("v1").good
    signed_repo.create_tag("plain")
    assert signed_repo.trust.verify_tag("plain").status == "unsigned"
    signed_repo.create_tag("v2", sign=other_key())
    assert signed_repo.trust.verify_tag("v2").status == "unknown"
    # a tag object edited to name another commit no longer verifies
    d = signed_repo.commit({"w": torch.ones(3)})
    with signed_repo.index.write() as txn:
        obj = TagObject.decode(txn.meta("tag/v1"))
        txn.put_meta("tag/v1", replace(obj, target=bytes.fromhex(d.id)).encode())
        ref = txn.ref("tags/v1")
        txn.set_ref("tags/v1", replace(ref, id=bytes.fromhex(d.id)))
    assert signed_repo.trust.verify_tag("v1").status == "bad"
    # moving a signed tag without signing drops its signature: it is a plain tag again
    signed_repo.create_tag("v2", d.id, force=True)
    assert signed_repo.trust.verify_tag("v2").status == "unsigned"
    signed_repo.delete_tag("v2")
    with signed_repo.index.read() as txn:
        assert txn.meta("tag/v2") is None
    with pytest.raises(mvc.UnknownRevision):
        signed_repo.trust.verify_tag("v2")


def test_a_tag_moved_under_its_signature_is_bad(signed_repo, key):
    signed_repo.commit({"w": torch.zeros(3)})
    signed_repo.create_tag("v1", sign=key)
    d = signed_repo.commit({"w": torch.ones(3)})
    with signed_repo.index.write() as txn:  # the ref moved by hand, the signed object left behind
        txn.set_ref("tags/v1", replace(txn.ref("tags/v1"), id=bytes.fromhex(d.id)))
    v = signed_repo.trust.verify_tag("v1")
    assert v.status == "bad" and "moved" in v.reason


# -- allowed signers and keys -------------------------------------------------------

def test_allowed_signers_options(key):
    payload = b"x"
    sig = signing.sign(key, payload)
    line = key.public_line()
    assert signing.verify(sig, payload, signing.parse_allowed_signers(f'a,b namespaces="git,mvc" {line}')).good
    assert signing.verify(sig, payload, signing.parse_allowed_signers(f'a namespaces="git" {line}')).status == "unknown"
    when = 1_700_000_000.0  # 2023-11-14
    late = signing.parse_allowed_signers(f'a valid-after="20240101Z" {line}')
    assert signing.verify(sig, payload, late, when).status == "unknown"
    assert signing.verify(sig, payload, late, when + 86400 * 365).good
    early = signing.parse_allowed_signers(f'a valid-before="20231101Z",namespaces="mvc" {line}')
    assert signing.verify(sig, payload, early, when).status == "unknown"
    assert signing.parse_allowed_signers(f"# comment\n\nca@x cert-authority {line}\n") == []


@pytest.mark.parametrize("text,line", [("justone\n", 1), ("# c\na ssh-ed25519 ***notbase64***\n", 2),
                                       ('a valid-after="yesterday" ssh-ed25519 AAAA\n', 1)])
def test_a_malformed_allowed_signers_line_is_named(text, line):
    with pytest.raises(BadAllowedSigners) as info:
        signing.parse_allowed_signers(text, "signers")
    assert (info.value.path, info.value.line) == ("signers", line)


def test_a_missing_allowed_signers_file_is_an_error(repo, key):
    c = repo.commit({"w": torch.zeros(3)}, sign=key)
    repo.config(signing.ALLOWED, "nowhere")
    with pytest.raises(BadAllowedSigners) as info:
        repo.trust.verify_commit(c.id)
    assert info.value.path.endswith("nowhere")


def test_keys_from_files(tmp_path, repo):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    private = Ed25519PrivateKey.from_private_bytes(SEED)
    plain = private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                  serialization.NoEncryption())
    locked = private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                   serialization.BestAvailableEncryption(b"sesame"))
    (tmp_path / "plain").write_bytes(plain)
    (tmp_path / "locked").write_bytes(locked)
    assert signing.load_key(tmp_path / "plain").public == signing.key_from_seed(SEED).public
    with pytest.raises(SigningKeyError) as info:
        signing.load_key(tmp_path / "locked")
    assert info.value.needs_passphrase and info.value.path.endswith("locked")
    with pytest.raises(SigningKeyError) as info:
        signing.load_key(tmp_path / "locked", b"wrong")
    assert info.value.needs_passphrase
    assert signing.load_key(tmp_path / "locked", b"sesame").public == signing.key_from_seed(SEED).public
    for bad in ("missing", "notakey"):
        (tmp_path / "notakey").write_text("hello")
        with pytest.raises(SigningKeyError) as info:
            signing.load_key(tmp_path / bad)
        assert info.value.path.endswith(bad)
    with pytest.raises(SigningKeyError):  # -S with no signing.key set
        repo.commit({"w": torch.zeros(1)}, sign=True)
    repo.config(signing.KEY, str(tmp_path / "plain"))
    signed = repo.commit({"w": torch.zeros(1)}, sign=True)  # signed by the key signing.key names
    assert repo.trust.verify_commit(signed.id).key == signing.load_key(tmp_path / "plain").fingerprint


def test_policy_refuses_an_unsigned_commit_before_writing(signed_repo, key):
    signed_repo.commit({"w": torch.zeros(3)}, "before the policy")
    signed_repo.config(signing.REQUIRE, "main, release/*")
    packs = sorted((signed_repo.dir / "packs").iterdir())
    with pytest.raises(SignatureRequired) as info:
        signed_repo.commit({"w": torch.ones(3)}, "unsigned")
    assert (info.value.ref, info.value.status) == ("heads/main", "unsigned")
    assert sorted((signed_repo.dir / "packs").iterdir()) == packs
    assert signed_repo.commit({"w": torch.ones(3)}, sign=key).branch == "main"
    assert signed_repo.commit({"w": torch.ones(3)}, branch="scratch").branch == "scratch"  # not protected


# -- the command line -----------------------------------------------------------------

def test_cli_commit_sign_verify_log_and_tag(signed_repo, key, tmp_path):
    from cryptography.hazmat.primitives import serialization
    (tmp_path / "key").write_bytes(key.private.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()))
    torch.save({"w": torch.arange(10.0)}, tmp_path / "a.pt")
    r = run_cli(signed_repo, "commit", str(tmp_path / "a.pt"), "-m", "one", "--signing-key", str(tmp_path / "key"))
    assert r.exit_code == 0, r.output
    r = run_cli(signed_repo, "commit", str(tmp_path / "a.pt"), "-m", "two", "-S")
    assert r.exit_code == 1 and "signing.key" in r.stderr and "Traceback" not in r.output
    assert run_cli(signed_repo, "config", "signing.key", "key").exit_code == 0
    torch.save({"w": torch.arange(11.0)}, tmp_path / "b.pt")
    assert run_cli(signed_repo, "commit", str(tmp_path / "b.pt"), "-m", "two", "-S").exit_code == 0
    torch.save({"w": torch.arange(12.0)}, tmp_path / "c.pt")
    assert run_cli(signed_repo, "commit", str(tmp_path / "c.pt"), "-m", "three").exit_code == 0
    r = run_cli(signed_repo, "verify-commit", "HEAD~1", "HEAD~2")
    assert r.exit_code == 0 and r.output.count("Good signature from ada@example.com") == 2
    r = run_cli(signed_repo, "verify-commit")
    assert r.exit_code == 1 and "No signature" in r.output
    r = run_cli(signed_repo, "log", "--show-signature")
    assert r.output.count("Good signature") == 2 and r.output.count("No signature") == 1
    assert "[good]" in run_cli(signed_repo, "log", "--oneline", "--show-signature").output
    r = run_cli(signed_repo, "tag", "-s", "v1", "HEAD~1", "-m", "ship it")
    assert r.exit_code == 0 and "Signed tag v1" in r.output
    r = run_cli(signed_repo, "verify-tag", "v1", "--json")
    assert r.exit_code == 0 and '"good": true' in r.output and "ship it" in r.output
    r = run_cli(signed_repo, "verify-tag", "nope")
    assert r.exit_code == 1 and r.stderr.startswith("mvc: error:")


@pytest.mark.slow  # importing lightning and fitting take about 20 s here
def test_the_lightning_callback_signs_every_commit(tmp_path, key):
    import test_hooks_lightning as lightning_tests  # its tiny real Trainer run (skips there without lightning)
    lightning_tests.fit(tmp_path, 1, monitor="train_loss", save_top_k=1, sign=key)
    with mvc.Repository.open(tmp_path / "repo") as repo:
        verdicts = [repo.trust.verify_commit(c.id) for c in repo.log("lightning")]
    assert verdicts and all(v.status == "unknown" and v.key == key.fingerprint for v in verdicts)


def test_the_trainer_callback_signs_every_commit(tmp_path, key):
    import test_hooks_transformers as hf_tests  # its tiny real Trainer run (skips there without transformers)
    run = hf_tests.trainer(tmp_path, "run", hf_tests.MvcCallback(tmp_path / "repo", chunk_size=64, sign=key),
                           max_steps=hf_tests.SAVE)
    run.train()
    with mvc.Repository.open(tmp_path / "repo") as repo:
        verdicts = [repo.trust.verify_commit(c.id) for c in repo.log("hf")]
    assert verdicts and all(v.status == "unknown" and v.key == key.fingerprint for v in verdicts)


def test_a_small_order_key_that_verifies_anything_is_bad():
    # OpenSSL accepts the all-zero public key with the all-zero signature for every message
    w = signing._string
    zero = signing.public_blob(bytes(32))
    blob = (signing.MAGIC + (1).to_bytes(4, "big") + w(zero) + w(b"mvc") + w(b"") + w(b"sha512")
            + w(w(b"ssh-ed25519") + w(bytes(64))))
    for payload in (b"anything", golden_commit().payload()):
        v = signing.verify(blob, payload, signing.parse_allowed_signers(f"x ssh-ed25519 "
                                                                         f"{__import__('base64').b64encode(zero).decode()}"))
        assert v.status == "bad" and "weak" in v.reason


from hypothesis import given, settings, strategies as st  # noqa: E402


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300), st.integers(0, 172), st.binary(min_size=1, max_size=4))
def test_hostile_signature_bytes_are_bad_never_an_exception(noise, at, splice):
    good = signing.sign(signing.key_from_seed(SEED), b"payload")
    allowed = signing.parse_allowed_signers(f"a {signing.key_from_seed(SEED).public_line()}")
    for blob in (noise, good[:at] + splice + good[at + len(splice):], good[:at]):
        if blob == good:
            continue
        v = signing.verify(blob, b"payload", allowed)
        assert v.status in ("bad", "unsigned")
