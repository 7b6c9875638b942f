"""Hugging Face Trainer with MvcCallback: a real Trainer on a tiny BERT built from its config.

12 steps straight must equal 7 steps (saves at 5 and 10: the run is
stopped after step 7, so its last commit is step 5), then a new Trainer
resumed from the mvc commit through ``checkout``, bit for bit: the loss
of every step and the final weights. The Trainer's own checkpoint
directories are removed once committed, but the newest and the best.
A tiny GPT-2 (tied lm_head and wte) checks out, loads with
from_pretrained and resumes; resume_from_checkpoint=True and
load_best_model_at_end=True work on the folders the callback leaves.
"""

import os

import pytest

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

import torch  # noqa: E402

import mvc  # noqa: E402
from mvc_hooks.transformers import MvcCallback  # noqa: E402

STEPS, SAVE = 12, 5


@pytest.fixture(autouse=True)
def no_temp_copies(tmp_path, monkeypatch):
    """Every test runs with its own temp folder, which must hold nothing of mvc's afterwards."""
    temp = tmp_path / "system-temp"
    temp.mkdir()
    monkeypatch.setenv("TMPDIR", str(temp))
    monkeypatch.setattr("tempfile.tempdir", None)
    yield
    assert not [n for n in os.listdir(temp) if "mvc" in n]


class Data(torch.utils.data.Dataset):
    def __init__(self):
        g = torch.Generator().manual_seed(1)
        self.ids = torch.randint(0, 50, (40, 6), generator=g)
        self.labels = torch.randint(0, 2, (40,), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.labels[i]}


class RecordingTrainer(transformers.Trainer):
    """Keeps every step's loss exactly (the Trainer logs rounded means)."""

    def compute_loss(self, model, inputs, return_outputs=False, **kwargs):
        loss = super().compute_loss(model, inputs, return_outputs=return_outputs, **kwargs)
        value = loss[0] if return_outputs else loss
        self.losses[self.state.global_step] = value.item()
        return loss


def trainer(tmp_path, name, callback=None, max_steps=STEPS):
    config = transformers.BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=32, max_position_embeddings=16, num_labels=2)
    transformers.set_seed(0)
    model = transformers.BertForSequenceClassification(config)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / name), max_steps=max_steps, per_device_train_batch_size=4,
        learning_rate=1e-3, lr_scheduler_type="linear", warmup_steps=2, save_strategy="steps",
        save_steps=SAVE, logging_steps=1, report_to=[], use_cpu=True, seed=0, disable_tqdm=True)
    t = RecordingTrainer(model=model, args=args, train_dataset=Data(),
                         callbacks=[callback] if callback else None)
    t.losses = {}
    return t


class StopAfter(transformers.TrainerCallback):
    """Ends the run after ``step``, as a kill would (the work after the last save is lost)."""

    def __init__(self, step):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step >= self.step:
            control.should_training_stop = True


def test_a_trainer_resumed_from_a_commit_is_bit_exact(tmp_path):
    straight = trainer(tmp_path, "straight", max_steps=STEPS)
    straight.train()

    callback = MvcCallback(tmp_path / "repo", chunk_size=64)
    first = trainer(tmp_path, "run", callback)
    first.add_callback(StopAfter(7))
    first.train()
    assert sorted(os.listdir(tmp_path / "run")) == ["checkpoint-5"]  # only the newest folder stays
    with mvc.Repository.open(tmp_path / "repo") as repo:
        commits = list(repo.log("hf"))
        assert [c.step for c in commits] == [5]
        assert "loss" in commits[0].metrics and commits[0].context["transformers"]["max_steps"] == STEPS
        state = repo.load("hf")
    assert set(state) >= {"model", "optimizer", "scheduler", "rng", "trainer_state"}
    assert state["trainer_state"]["global_step"] == 5

    callback = MvcCallback(tmp_path / "repo", chunk_size=64)
    second = trainer(tmp_path, "run", callback)
    second.train(resume_from_checkpoint=callback.checkout())
    losses = {**{s: v for s, v in first.losses.items() if s < 5}, **second.losses}
    assert losses == straight.losses and sorted(losses) == list(range(STEPS))
    for (name, a), (_, b) in zip(second.model.named_parameters(), straight.model.named_parameters()):
        assert torch.equal(a, b), name
    with mvc.Repository.open(tmp_path / "repo") as repo:
        assert [c.step for c in repo.log("hf")] == [12, 10, 5]
        assert [c.message for c in repo.log("hf")] == ["hf checkpoint-12", "hf checkpoint-10", "hf checkpoint-5"]
        ten = repo.get_commit("hf~1")
    assert sorted(os.listdir(tmp_path / "run")) == ["checkpoint-12"]  # the first process's folder went too

    # resumed from behind the tip: the new step-12 commit follows the old one and says where it resumed
    third = trainer(tmp_path, "again", callback)
    third.train(resume_from_checkpoint=callback.checkout("hf~1"))
    assert third.losses == {s: v for s, v in straight.losses.items() if s >= 10}
    with mvc.Repository.open(tmp_path / "repo") as repo:
        newest = next(iter(repo.log("hf")))
        assert [c.step for c in repo.log("hf")] == [12, 12, 10, 5]
    assert newest.message == f"hf checkpoint-12 (resumed from checkpoint-10, {ten.short_id})"
    assert newest.context["transformers"]["resumed_from"] == {"step": 10, "commit": ten.id}


def test_checkout_of_another_commit_is_refused(tmp_path):
    with mvc.Repository.init(tmp_path / "repo") as repo:
        repo.commit({"w": torch.zeros(2)}, message="not a trainer", branch="hf")
    with pytest.raises(mvc.BadInput, match="was not made by mvc_hooks.transformers.MvcCallback"):
        MvcCallback(tmp_path / "repo").checkout()


def test_remote_gets_each_commit_pushed_and_a_clone_resumes_from_it(tmp_path):
    with mvc.Repository.init(tmp_path / "repo", chunk_size=64) as repo:
        repo.remotes.add("origin", str(tmp_path / "remote"))
    callback = MvcCallback(tmp_path / "repo", remote="origin")
    trainer(tmp_path, "run", callback, max_steps=SAVE * 2).train()
    assert callback.push_error is None
    with mvc.Repository.open(tmp_path / "repo") as repo:
        tip = repo.resolve("hf")
    with mvc.Repository.clone(str(tmp_path / "remote"), tmp_path / "eval") as clone:
        assert clone.resolve("origin/hf") == tip
        assert [c.step for c in clone.log("origin/hf")] == [10, 5]
        assert clone.fsck().ok
    # The clone's copy is a checkpoint the Trainer resumes from.
    remote_side = MvcCallback(tmp_path / "eval", branch="hf")
    with pytest.raises(mvc.BadInput, match="directory="):  # no Trainer told it an output_dir: no temp folder
        remote_side.checkout("origin/hf")
    path = remote_side.checkout("origin/hf", directory=tmp_path / "resume" / "checkpoint-10")
    assert os.path.exists(os.path.join(path, "trainer_state.json"))
    assert sorted(os.listdir(tmp_path / "resume")) == ["checkpoint-10"]  # nothing left beside it


def test_a_remote_the_repository_lacks_is_refused_before_training(tmp_path):
    with pytest.raises(mvc.BadInput, match="no remote 'origin'"):
        trainer(tmp_path, "run", MvcCallback(tmp_path / "repo", remote="origin")).train()
    with mvc.Repository.open(tmp_path / "repo") as repo:
        assert repo.locks.list() == []


# -- GPT-2 (tied lm_head / wte) and the Trainer's own idioms on what the callback leaves ----

class Tokens(torch.utils.data.Dataset):
    def __init__(self, n=40, seed=1):
        self.ids = torch.randint(0, 50, (n, 8), generator=torch.Generator().manual_seed(seed))

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def gpt2_trainer(tmp_path, callback, max_steps, **kw):
    config = transformers.GPT2Config(vocab_size=50, n_positions=16, n_embd=16, n_layer=1, n_head=2,
                                     bos_token_id=0, eos_token_id=0)
    transformers.set_seed(0)
    model = transformers.GPT2LMHeadModel(config)
    assert model.lm_head.weight is model.transformer.wte.weight
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"), max_steps=max_steps, per_device_train_batch_size=4,
        learning_rate=1e-2, save_strategy="steps", save_steps=SAVE, logging_steps=1, report_to=[],
        use_cpu=True, seed=0, disable_tqdm=True, **kw)
    t = RecordingTrainer(model=model, args=args, train_dataset=Tokens(), eval_dataset=Tokens(8, seed=2),
                         callbacks=[callback])
    t.losses = {}
    return t


@pytest.mark.slow
def test_tied_weights_check_out_resume_and_load_with_from_pretrained(tmp_path):
    straight = gpt2_trainer(tmp_path / "straight", MvcCallback(tmp_path / "straight-repo"), STEPS)
    straight.train()
    first = gpt2_trainer(tmp_path, MvcCallback(tmp_path / "repo", chunk_size=64), STEPS)
    first.add_callback(StopAfter(7))
    first.train()

    callback = MvcCallback(tmp_path / "repo", chunk_size=64)
    second = gpt2_trainer(tmp_path, callback, STEPS)
    path = callback.checkout("hf~0")
    assert path == str(tmp_path / "out" / "checkpoint-5") and os.path.exists(os.path.join(path, "config.json"))
    loaded = transformers.GPT2LMHeadModel.from_pretrained(path)
    assert loaded.lm_head.weight is loaded.transformer.wte.weight
    with mvc.Repository.open(tmp_path / "repo") as repo:
        saved = repo.load("hf")["model"]
    for name, tensor in loaded.state_dict().items():
        assert torch.equal(tensor, saved[name]), name
    second.train(resume_from_checkpoint=path)
    losses = {**{s: v for s, v in first.losses.items() if s < 5}, **second.losses}
    assert losses == straight.losses
    for (name, a), (_, b) in zip(second.model.named_parameters(), straight.model.named_parameters()):
        assert torch.equal(a, b), name


@pytest.mark.slow
def test_resume_true_and_load_best_model_at_end_work_on_what_the_callback_leaves(tmp_path, caplog):
    # at this learning rate the eval loss rises after step 5: the best is not the newest (15)
    kw = dict(eval_strategy="steps", eval_steps=SAVE, load_best_model_at_end=True,
              metric_for_best_model="eval_loss", greater_is_better=False)
    callback = MvcCallback(tmp_path / "repo", chunk_size=64)
    first = gpt2_trainer(tmp_path, callback, 15, **kw)
    with caplog.at_level("WARNING"):
        first.train()
    assert "Could not locate the best model" not in caplog.text
    best_step = first.state.best_global_step
    assert best_step in (5, 10)
    assert sorted(os.listdir(tmp_path / "out")) == sorted(["checkpoint-15", f"checkpoint-{best_step}"])
    with mvc.Repository.open(tmp_path / "repo") as repo:
        commits = list(repo.log("hf"))
        assert [c.step for c in commits] == [15, 10, 5]  # the repository keeps every save
        best = repo.load(next(c.id for c in commits if c.step == best_step))["model"]
        last = repo.load("hf")["model"]
    assert not all(torch.equal(best[k], last[k]) for k in best)
    for name, tensor in first.model.state_dict().items():  # the run ended on the best weights
        assert torch.equal(tensor, best[name]), name
    assert transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "out" / "checkpoint-15") is not None

    more = gpt2_trainer(tmp_path, MvcCallback(tmp_path / "repo", chunk_size=64), 20, **kw)
    more.train(resume_from_checkpoint=True)
    assert min(more.losses) == 15  # went on from the newest checkpoint
    with mvc.Repository.open(tmp_path / "repo") as repo:
        assert [c.step for c in repo.log("hf")][:2] == [20, 15]
