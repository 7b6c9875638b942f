"""The remote commands answer a mistyped remote name as a mistyped command is answered:
with the configured remote it is closest to, not advice to add the typo as a new remote."""

import pytest
import torch

from mvc import errors

from conftest import run_cli


def test_a_mistyped_remote_name_is_answered_with_the_closest_configured_one(repo, tmp_path):
    repo.commit({"w": torch.ones(8)}, "one")
    repo.remotes.add("origin", str(tmp_path / "remote"))
    repo.remotes.add("backup", str(tmp_path / "other"))
    for typo, args in [("orign", ["push", "orign"]), ("orign", ["fetch", "orign"]), ("orign", ["pull", "orign"]),
                       ("orign", ["fsck", "--remote", "orign"]), ("orgin", ["remote", "remove", "orgin"]),
                       ("orign", ["remote", "lock", "orign", "main"]), ("orign", ["gc", "--remote", "orign"]),
                       ("orign", ["remote", "repair", "orign"])]:
        out = run_cli(repo, *args)
        assert out.exit_code == 1, (args, out.output)
        assert out.stderr == f"mvc: error: no remote named {typo!r}; did you mean 'origin'?\n", args
    assert not (tmp_path / "remote").exists()  # nothing was pushed anywhere
    assert run_cli(repo, "push", "bakup").stderr.endswith("did you mean 'backup'?\n")
    err = pytest.raises(errors.UnknownRemote, repo.remotes.remove, "orign").value
    assert (err.name, err.known) == ("orign", ("backup", "origin"))  # data the advice is made of
    far = run_cli(repo, "push", "zzz")  # like no configured remote: the advice to add it stands
    assert far.exit_code == 1
    assert far.stderr == "mvc: error: no remote named 'zzz'; add it with 'mvc remote add zzz URL'\n"
