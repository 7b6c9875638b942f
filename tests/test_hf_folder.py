"""Hugging Face model folders: commit one (single file or sharded), write it back, load it with transformers.

The model is built from a config (no download), tiny, and saved with the real
``save_pretrained``; the exported folder is loaded with the real
``AutoModel.from_pretrained``.
"""

import json

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file

import mvc
from mvc.cli import main

transformers = pytest.importorskip("transformers")


def cli(root, *args, code=0):
    out = CliRunner().invoke(main, ["-C", str(root), *[str(a) for a in args]])
    assert out.exit_code == code, (out.output, out.stderr)
    return out


def tiny_model():
    config = transformers.BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=32, max_position_embeddings=32)
    torch.manual_seed(0)
    return transformers.BertModel(config).eval()


def same_weights(a, b) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


@pytest.fixture
def repo_root(tmp_path):
    mvc.Repository.init(tmp_path / "repo", chunk_size=4096).close()
    return tmp_path / "repo"


@pytest.mark.parametrize("shard", [None, "20KB"], ids=["single-file", "sharded"])
def test_commit_a_model_folder_and_load_the_export_with_transformers(repo_root, tmp_path, shard):
    model = tiny_model()
    source = tmp_path / "hf"
    model.save_pretrained(source, **({"max_shard_size": shard} if shard else {}))
    (source / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 32}))
    (source / "vocab.txt").write_text("\n".join(f"tok{i}" for i in range(64)))
    shards = sorted(p.name for p in source.glob("*.safetensors"))
    assert (len(shards) > 1) == bool(shard)

    out = cli(repo_root, "commit", source).stdout
    assert f"Import model folder hf/ ({len(shards)} safetensors" in out
    cli(repo_root, "checkout", "HEAD", "-o", tmp_path / "back")
    back = tmp_path / "back"
    assert sorted(p.name for p in back.glob("*.safetensors")) == shards  # sharded the same way
    for name in ("config.json", "tokenizer_config.json", "vocab.txt") + (("model.safetensors.index.json",) if shard else ()):
        assert (back / name).read_bytes() == (source / name).read_bytes(), name
    for name in shards:
        a, b = load_file(source / name), load_file(back / name)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) and a[k].dtype == b[k].dtype for k in a)
    loaded = transformers.AutoModel.from_pretrained(back)
    assert same_weights(model, loaded)
    ids = torch.tensor([[1, 2, 3]])
    with torch.no_grad():
        assert torch.equal(model(ids).last_hidden_state, loaded(ids).last_hidden_state)


def test_folder_export_refuses_a_busy_folder_and_writes_nothing_half(repo_root, tmp_path):
    tiny_model().save_pretrained(tmp_path / "hf")
    cli(repo_root, "commit", tmp_path / "hf", "-m", "bert")
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("mine")
    err = cli(repo_root, "export", "-o", busy, code=1).stderr
    assert "already holds files; pass --force" in err and err.count("\n") == 1
    assert sorted(p.name for p in busy.iterdir()) == ["notes.txt"]
    cli(repo_root, "export", "-o", busy, "--force")  # replaces the folder whole: notes.txt is not the commit's
    assert not (busy / "notes.txt").exists() and (busy / "model.safetensors").exists()
    assert not [p for p in tmp_path.iterdir() if ".tmp" in p.name]


def test_a_folder_commit_exports_its_tensors_or_a_subtree_to_one_file(repo_root, tmp_path):
    model = tiny_model()
    model.save_pretrained(tmp_path / "hf")
    cli(repo_root, "commit", tmp_path / "hf")
    out = cli(repo_root, "export", "-o", tmp_path / "all.safetensors")
    assert "other file" in out.stderr and "-o DIR writes the whole folder" in out.stderr
    assert load_file(tmp_path / "all.safetensors").keys() == load_file(tmp_path / "hf" / "model.safetensors").keys()
    cli(repo_root, "export", "-o", tmp_path / "enc.safetensors", "--only", "encoder.*", "--strip-prefix", "encoder.")
    layer = load_file(tmp_path / "enc.safetensors")
    assert "layer.0.attention.self.query.weight" in layer
    assert torch.equal(layer["layer.1.output.dense.bias"], model.encoder.layer[1].output.dense.bias)


def test_a_folder_without_safetensors_is_refused(repo_root, tmp_path):
    folder = tmp_path / "empty"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    err = cli(repo_root, "commit", folder, code=1).stderr
    assert "holds no .safetensors file" in err and err.count("\n") == 1
    torch.save({"w": torch.ones(2)}, tmp_path / "plain.pt")
    cli(repo_root, "commit", tmp_path / "plain.pt")
    assert "was not committed from a model folder" in cli(repo_root, "export", "-o", str(tmp_path / "dir") + "/",
                                                          code=1).stderr


def test_training_hook_commit_exports_straight_to_an_inference_state_dict(repo_root, tmp_path):
    model = tiny_model()
    with mvc.Repository.open(repo_root) as repo:  # what Checkpointer stores: {"model": state_dict, ...}
        repo.commit({"model": model.state_dict(), "optimizer": {"state": {}, "param_groups": []}}, "step 10", step=10)
    cli(repo_root, "checkout", "HEAD", "-o", tmp_path / "model.safetensors", "--only", "model.*",
        "--strip-prefix", "model.")
    fresh = transformers.BertModel(model.config)
    missing = fresh.load_state_dict(load_file(tmp_path / "model.safetensors"), strict=True)
    assert not missing.missing_keys and not missing.unexpected_keys and same_weights(model, fresh)
