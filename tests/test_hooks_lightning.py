"""PyTorch Lightning with MvcCheckpoint: a real Trainer on a tiny model, commits instead of files.

Four epochs straight must equal two epochs, a new Trainer resumed with
``ckpt_path="mvc:lightning"``, and two more, bit for bit (losses of every
step and the weights); the top-k and last checkpoints are tags, and a
checkpoint that left the top k is pruned by retention, not deleted.
"""

import os
import warnings

import pytest

pl = pytest.importorskip("lightning.pytorch")

import torch  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

import mvc  # noqa: E402
from mvc_hooks.lightning import MvcCheckpoint, load_checkpoint, open_checkpoint  # noqa: E402


class Net(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Dropout(0.3), torch.nn.Linear(16, 1))
        self.losses = {}

    def training_step(self, batch, index):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.losses[self.global_step] = loss.item()
        self.log("train_loss", loss, on_step=False, on_epoch=True)
        return loss

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=0.01)
        return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, 3)}


def loader():
    g = torch.Generator().manual_seed(1)
    data = TensorDataset(torch.randn(64, 4, generator=g), torch.randn(64, 1, generator=g))
    return DataLoader(data, batch_size=8, shuffle=True)  # no generator: draws from the global RNG


def fit(root, epochs, ckpt_path=None, **kwargs):
    pl.seed_everything(0, verbose=False)
    model = Net()
    callback = MvcCheckpoint(root / "repo", chunk_size=64, **kwargs)
    trainer = pl.Trainer(max_epochs=epochs, accelerator="cpu", devices=1, logger=False,
                         enable_progress_bar=False, enable_model_summary=False, callbacks=[callback],
                         default_root_dir=root)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(model, loader(), ckpt_path=ckpt_path)
    return model, callback


TOP = {"monitor": "train_loss", "mode": "min", "save_top_k": 2, "save_last": True}


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    model, _ = fit(tmp_path_factory.mktemp("straight"), 4, **TOP)
    return model.losses, [p.detach().clone() for p in model.parameters()]


def test_a_resumed_fit_is_bit_exact_and_keeps_the_top_k_by_retention(tmp_path, straight):
    want_losses, want_params = straight
    first, callback = fit(tmp_path, 2, **TOP)
    second, callback = fit(tmp_path, 4, ckpt_path="mvc:lightning", **TOP)
    assert {**first.losses, **second.losses} == want_losses and len(want_losses) == 32
    assert all(torch.equal(a, b) for a, b in zip(second.parameters(), want_params))

    with mvc.Repository.open(tmp_path / "repo") as repo:
        tags = {t.name: t.id for t in repo.tags()}
        kept = {f"lightning/{p.rsplit('/', 1)[-1][:-5]}" for p in callback.best_k_models}
        assert set(tags) == kept | {"lightning/last"} and len(kept) == 2
        tip = repo.get_commit("lightning")
        assert tags["lightning/last"] == tip.id and tip.step == 32 and tip.epoch == 3
        state = repo.load("lightning/last")
        for key in ("epoch", "global_step", "state_dict", "optimizer_states", "lr_schedulers", "loops",
                    "callbacks", "pytorch-lightning_version"):
            assert key in state, key
        assert torch.equal(state["state_dict"]["net.0.weight"], second.net[0].weight)
        assert "train_loss" in tip.metrics
        pruned = [c for c in repo.log("lightning") if c.id not in tags.values() and c.id != tip.id]
        assert pruned  # checkpoints that left the top k, and older "last" ones
        with pytest.raises(mvc.ObjectNotFound, match="pruned by gc"):
            repo.load(pruned[0].id)

    # a path the callback handed out resumes too (it names a tag of the callback's branch)
    best = callback.best_model_path
    third, _ = fit(tmp_path, 5, ckpt_path=best, **TOP)
    assert min(third.losses) == int(best.rsplit("step=", 1)[1][:-5])  # it went on from the best one's step


HOLD_SHARED = """
import sys, time, mvc
repo = mvc.Repository.open(sys.argv[1])
with repo.gc_lock.shared():  # as a background push does for its whole upload
    print("READY", flush=True)
    time.sleep(600)
"""


def test_retention_never_waits_for_a_push_in_flight(tmp_path):
    """Retention (a gc after the last tag moves) waited in the training step for the gc lock a
    background push held, and after a minute GcLockBusy failed the fit. It is left for the next
    checkpoint instead."""
    import subprocess
    import sys
    mvc.Repository.init(tmp_path / "repo", chunk_size=64).close()
    child = subprocess.Popen([sys.executable, "-c", HOLD_SHARED, str(tmp_path / "repo")], stdout=subprocess.PIPE,
                             text=True)
    try:
        assert child.stdout.readline().strip() == "READY"
        fit(tmp_path, 3, **TOP)
    finally:
        child.kill()
        child.wait()
    _, callback = fit(tmp_path, 4, ckpt_path="mvc:lightning", **TOP)  # the lock is free: retention runs
    with mvc.Repository.open(tmp_path / "repo") as repo:
        kept = [c for c in repo.log("lightning") if not c.pruned]
        assert repo.fsck().ok and len(kept) < len(list(repo.log("lightning")))


def test_save_last_link_moves_a_tag_instead_of_committing_twice(tmp_path):
    _, callback = fit(tmp_path, 2, monitor="train_loss", save_top_k=-1, save_last="link")
    with mvc.Repository.open(tmp_path / "repo") as repo:
        commits = list(repo.log("lightning"))
        tags = {t.name: t.id for t in repo.tags()}
    assert [c.step for c in commits] == [16, 8]
    assert tags["lightning/last"] == commits[0].id
    assert callback.last_model_path.endswith("last.ckpt")


def test_a_revision_that_does_not_exist_is_a_clear_error(tmp_path):
    fit(tmp_path, 1, **TOP)
    with pytest.raises(mvc.UnknownRevision):
        fit(tmp_path, 2, ckpt_path="mvc:no-such-branch", **TOP)


def test_remote_gets_each_commit_pushed_and_a_clone_loads_the_tip(tmp_path):
    with mvc.Repository.init(tmp_path / "repo", chunk_size=64) as repo:
        repo.remotes.add("origin", str(tmp_path / "remote"))
    _, callback = fit(tmp_path, 2, remote="origin", **TOP)
    assert callback.push_error is None
    with mvc.Repository.open(tmp_path / "repo") as repo:
        tip = repo.resolve("lightning")
    with mvc.Repository.clone(str(tmp_path / "remote"), tmp_path / "eval") as clone:
        assert clone.resolve("origin/lightning") == tip
        assert clone.fsck().ok
        assert clone.load("origin/lightning")["global_step"] == 16


def test_in_a_lazy_clone_the_checkpoints_lightning_keeps_are_kept_here(tmp_path):
    """Lightning's tags stay local, so no remote ref keeps them: eviction, then a remote gc with
    retention, lost a top-k checkpoint. Its tags are pinned (kept whatever the cache budget)."""
    from mvc.remote import config
    with mvc.Repository.init(tmp_path / "src", chunk_size=64) as src:
        src.commit({"w": torch.zeros(4)}, "a start")
        src.remotes.add("origin", str(tmp_path / "remote"))
        src.remotes.push()
    mvc.Repository.clone(str(tmp_path / "remote"), tmp_path / "repo", lazy=True).close()
    fit(tmp_path, 3, remote="origin", **TOP)
    with mvc.Repository.open(tmp_path / "repo") as repo:
        tags = {"tags/" + t.name for t in repo.tags() if t.name.startswith("lightning/")}
        with repo.index.read() as txn:
            pinned = set(config.pins(txn))
        assert tags and tags <= pinned and not {p for p in pinned if p.startswith("tags/lightning/")} - tags
        repo.cache.evict(0)
        from mvc.remote.tiers import commit_chunks
        with repo.index.read() as txn:  # their chunks stayed here: no remote gc can take them
            kept = commit_chunks(repo, txn, {bytes.fromhex(repo.resolve(n[len("tags/"):])) for n in tags})
            assert kept and repo.chunks.remote_only(kept, txn) == set()


def test_a_remote_the_repository_lacks_is_refused_before_training(tmp_path):
    with pytest.raises(mvc.BadInput, match="no remote 'origin'"):
        fit(tmp_path, 1, remote="origin", **TOP)
    with mvc.Repository.open(tmp_path / "repo") as repo:  # nothing committed, no lock left behind
        assert "lightning" not in {b.name for b in repo.branches()}
        assert repo.locks.list() == []


# -- Lightning's own idioms on the paths the callback reports --------------------------

def test_ckpt_path_last_and_best_resume_from_the_repository(tmp_path, straight):
    want_losses, want_params = straight
    first, callback = fit(tmp_path, 2, **TOP)
    resumed, _ = fit(tmp_path, 4, ckpt_path="last", **TOP)  # a new Trainer and callback: Lightning finds last.ckpt
    assert min(resumed.losses) == 16
    assert {**first.losses, **resumed.losses} == want_losses
    assert all(torch.equal(a, b) for a, b in zip(resumed.parameters(), want_params))

    _, callback = fit(tmp_path, 4, ckpt_path="last", **TOP)  # nothing left to train: it only restores
    best = callback.best_model_path
    again, fresh = fit(tmp_path, 5, ckpt_path="best", **TOP)  # a new callback finds the best pointer
    assert min(again.losses) == int(best.rsplit("step=", 1)[1][:-5])


def test_reported_paths_are_pointer_files_that_open_as_the_checkpoint(tmp_path):
    model, callback = fit(tmp_path, 3, **TOP)
    dirpath = tmp_path / "repo"
    pointers = sorted(n for n in os.listdir(dirpath) if n.endswith(".ckpt"))
    assert pointers == sorted([os.path.basename(p) for p in callback.best_k_models] + ["last.ckpt"])
    best = callback.best_model_path
    assert os.path.isfile(best) and os.path.getsize(best) < 4096
    pointer = torch.load(best, weights_only=True)["mvc_checkpoint"]  # torch.load of the path: the pointer
    with mvc.Repository.open(dirpath) as repo:
        assert pointer["commit"] == repo.resolve(pointer["tag"])
        saved = repo.load(pointer["commit"])
        last = repo.get_commit("lightning/last")
    restored = Net.load_from_checkpoint(open_checkpoint(best))
    for name, tensor in restored.state_dict().items():
        assert torch.equal(tensor, saved["state_dict"][name]), name
    full = torch.load(open_checkpoint(callback.last_model_path), weights_only=True)
    assert full["global_step"] == last.step and full["epoch"] == last.epoch
    with pytest.raises(mvc.BadInput, match="not a checkpoint pointer"):
        load_checkpoint(__file__)


def test_lightning_given_a_pointer_itself_says_to_use_open_checkpoint(tmp_path):
    """Model.load_from_checkpoint(pointer) failed with KeyError: 'pytorch-lightning_version'."""
    _, callback = fit(tmp_path, 1, **TOP)
    with pytest.raises(Exception) as caught:
        Net.load_from_checkpoint(callback.last_model_path)
    assert not isinstance(caught.value, KeyError)
    assert "mvc pointer, not the checkpoint" in str(caught.value) and "open_checkpoint(path)" in str(caught.value)
    restored = Net.load_from_checkpoint(open_checkpoint(callback.last_model_path))  # the way it names
    assert restored.state_dict().keys() == Net().state_dict().keys()
    old = tmp_path / "old.ckpt"  # a pointer as older versions wrote it (the pointer alone) still reads
    torch.save({"mvc_checkpoint": torch.load(callback.last_model_path, weights_only=True)["mvc_checkpoint"]}, old)
    assert load_checkpoint(old)["global_step"] == load_checkpoint(callback.last_model_path)["global_step"]


def test_dirpath_places_the_repository_and_its_pointers(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    pl.seed_everything(0, verbose=False)
    callback = MvcCheckpoint(dirpath="ckpts", monitor="train_loss", save_top_k=1, chunk_size=64)
    trainer = pl.Trainer(max_epochs=1, accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                         enable_model_summary=False, callbacks=[callback])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(Net(), loader())
    assert (tmp_path / "ckpts" / ".mvc").is_dir() and not (tmp_path / ".mvc").exists()
    assert os.path.dirname(callback.best_model_path) == str(tmp_path / "ckpts")
    with mvc.Repository.open(tmp_path / "ckpts") as repo:
        assert repo.get_commit("lightning").step == 8


def test_pointers_name_the_repository_by_its_absolute_path(tmp_path, monkeypatch):
    """A fresh run with a relative dirpath wrote ``{"repository": "ckpts"}``: read from any other
    folder the pointer named the wrong repository (only a resumed run wrote the absolute path)."""
    (tmp_path / "run").mkdir()
    monkeypatch.chdir(tmp_path / "run")
    pl.seed_everything(0, verbose=False)
    callback = MvcCheckpoint(dirpath="ckpts", monitor="train_loss", save_top_k=1, save_last=True, chunk_size=64)
    trainer = pl.Trainer(max_epochs=1, accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                         enable_model_summary=False, callbacks=[callback])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(Net(), loader())
    repository = os.path.realpath(tmp_path / "run" / "ckpts")
    for path in (callback.best_model_path, callback.last_model_path):
        assert torch.load(path, weights_only=True)["mvc_checkpoint"]["repository"] == repository
    monkeypatch.chdir(tmp_path)
    assert load_checkpoint(callback.best_model_path)["global_step"] == 8


def test_a_pointer_with_a_relative_path_is_read_against_its_own_folders(tmp_path, monkeypatch):
    """Pointers written before they held absolute paths name the repository relative to the folder
    the run started in, which is the pointer's folder or one above it."""
    fit(tmp_path, 1, **TOP)  # the repository and its pointers in tmp_path/repo
    with mvc.Repository.open(tmp_path / "repo") as repo:
        commit = repo.resolve("lightning/last")
    (tmp_path / "ckpts").mkdir()
    old = {tmp_path / "repo" / "old.ckpt": ".",  # dirpath and repository were one folder, the run's
           tmp_path / "repo" / "older.ckpt": "repo",  # dirpath "repo", run from tmp_path
           tmp_path / "ckpts" / "apart.ckpt": "repo"}  # repo="repo", dirpath="ckpts"
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "repo").mkdir(parents=True)  # a folder named like it, nearer the current folder
    monkeypatch.chdir(elsewhere)
    for path, relative in old.items():
        torch.save({"mvc_checkpoint": {"repository": relative, "commit": commit, "tag": "lightning/last"}}, path)
        assert load_checkpoint(path)["global_step"] == 8, path
    resumed, _ = fit(tmp_path, 2, ckpt_path=str(tmp_path / "ckpts" / "apart.ckpt"), **TOP)
    assert min(resumed.losses) == 8


# -- the README's example, as written there -----------------------------------------------

README = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.md")


def readme_lightning_example() -> dict:
    """The callback's keywords, max_epochs and the ``mvc:`` revision resumed from in the README's
    Lightning example."""
    import re
    with open(README, encoding="utf-8") as f:
        section = f.read().split("### PyTorch Lightning", 1)[1]
    block = section.split("```python", 1)[1].split("```", 1)[0]
    return {"callback": eval("dict(" + re.search(r"MvcCheckpoint\((.*?)\)\n", block)[1] + ")"),
            "max_epochs": int(re.search(r"max_epochs=(\d+)", block)[1]),
            "revision": re.search(r'ckpt_path="(mvc:[^"]+)"', block)[1]}


class Overfits(Net):
    """Net with a validation loss that is best at epoch 3 (the run overfits after it), so which
    checkpoints the top k keeps is known; 100 steps an epoch."""

    def validation_step(self, batch, index):
        self.log("val_loss", abs(self.current_epoch - 3.0))

    def on_train_start(self):
        self.started_at = (self.global_step, self.current_epoch)


class Data(pl.LightningDataModule):
    def train_dataloader(self):
        g = torch.Generator().manual_seed(1)
        return DataLoader(TensorDataset(torch.randn(100, 4, generator=g), torch.randn(100, 1, generator=g)))

    def val_dataloader(self):
        return DataLoader(TensorDataset(torch.zeros(1, 4), torch.zeros(1, 1)))


def test_the_readme_example_resumes_from_the_revision_it_names(tmp_path, monkeypatch):
    """The README resumed from ``mvc:lightning~2``: with save_top_k=3 and save_last=True each
    save is two commits (the top-k one, then last) and the older last ones are pruned, so that
    named a pruned commit (CommitPruned). It now names a checkpoint the callback keeps."""
    example = readme_lightning_example()
    monkeypatch.chdir(tmp_path)

    def fit_as_the_readme(ckpt_path=None):
        pl.seed_everything(0, verbose=False)
        model, checkpoint = Overfits(), MvcCheckpoint(**example["callback"])
        trainer = pl.Trainer(callbacks=[checkpoint], max_epochs=example["max_epochs"], accelerator="cpu",
                             devices=1, logger=False, enable_progress_bar=False, enable_model_summary=False)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.fit(model, Data(), ckpt_path=ckpt_path)
        return model

    fit_as_the_readme()
    with mvc.Repository.open("ckpts") as repo:
        state = repo.load(example["revision"][len("mvc:"):])
        with pytest.raises(mvc.CommitPruned):  # as the README says of lightning~2
            repo.load("lightning~2")
    resumed = fit_as_the_readme(example["revision"])
    assert resumed.started_at == (state["global_step"], state["epoch"] + 1)
