"""Hugging Face Trainer with MvcCallback: a real Trainer on a tiny BERT built from its config.

12 steps straight must equal 7 steps (saves at 5 and 10: the run is
stopped after step 7, so its last commit is step 5), then a new Trainer
resumed from the mvc commit through ``checkout``, bit for bit: the loss
of every step and the final weights. The Trainer's own checkpoint
directories are removed once committed.
"""

import os

import pytest

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

import torch  # noqa: E402

import mvc  # noqa: E402
from mvc_hooks.transformers import MvcCallback  # noqa: E402

STEPS, SAVE = 12, 5


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
    assert not any(n.startswith("checkpoint-") for n in os.listdir(tmp_path / "run"))
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


def test_checkout_of_another_commit_is_refused(tmp_path):
    with mvc.Repository.init(tmp_path / "repo") as repo:
        repo.commit({"w": torch.zeros(2)}, message="not a trainer", branch="hf")
    with pytest.raises(mvc.BadInput, match="was not made by mvc_hooks.transformers.MvcCallback"):
        MvcCallback(tmp_path / "repo").checkout()


def test_remote_gets_each_commit_pushed_and_a_clone_resumes_from_it(tmp_path):
    with mvc.Repository.init(tmp_path / "repo", chunk_size=64) as repo:
        repo.remote_add("origin", str(tmp_path / "remote"))
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
    path = remote_side.checkout("origin/hf")
    assert os.path.exists(os.path.join(path, "trainer_state.json"))


def test_a_remote_the_repository_lacks_is_refused_before_training(tmp_path):
    with pytest.raises(mvc.BadInput, match="no remote 'origin'"):
        trainer(tmp_path, "run", MvcCallback(tmp_path / "repo", remote="origin")).train()
    with mvc.Repository.open(tmp_path / "repo") as repo:
        assert repo.locks() == []
