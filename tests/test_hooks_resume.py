"""Bit-exact resume: 2N steps straight equal N steps, a stop (or SIGKILL), a resume and N more.

The run is examples/train.py: an MLP with dropout on shuffled batches (a
plain DataLoader(shuffle=True) with no generator, given as loader=), AdamW,
a cosine schedule and an enabled CPU GradScaler. 60 steps of 16 batches an
epoch: the commits at steps 19 and 39 are in the middle of epochs.
"""

import contextlib
import importlib.util
import io
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import mvc
from mvc_hooks import Checkpointer

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "train.py"
TOTAL, EVERY = 60, 20


def load_example():
    spec = importlib.util.spec_from_file_location("example_train", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


example = load_example()


def args_for(repo, *more):
    return ["--repo", str(repo), "--steps", str(TOTAL), "--every", str(EVERY), "--log-every", "1",
            "--sleep", "0", *more]


def losses_in(text: str) -> dict:
    return {int(s): float(v) for s, v in re.findall(r"^step (\d+) loss (\S+)$", text, re.M)}


def assert_same(a, b, where="state"):
    assert type(a) is type(b), where
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert list(a) == list(b), where
        for k in a:
            assert_same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


def final_state(repo_path):
    with mvc.Repository.open(repo_path) as repo:
        commit = repo.get_commit("HEAD")
        return commit.step, repo.load("HEAD")


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """The uninterrupted run: its per-step losses and final state."""
    path = tmp_path_factory.mktemp("straight")
    out = run_in_process(args_for(path))
    losses = losses_in(out)
    assert sorted(losses) == list(range(TOTAL))
    return losses, final_state(path)


def run_in_process(argv) -> str:
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        assert example.main(argv) == 0
    return buffer.getvalue()


@pytest.mark.parametrize("async_save", [False, True])
def test_stop_and_resume_in_process_is_bit_exact(tmp_path, straight, async_save):
    straight_losses, (_, straight_state) = straight
    losses = {}
    settings = SimpleNamespace(seed=0, steps=TOTAL)
    for start_expected, stop in ((0, TOTAL // 2), (TOTAL // 2, TOTAL)):
        parts = example.build(settings)  # fresh objects, as a new process would have
        model, optimizer, scheduler, scaler, loader = parts
        with Checkpointer(tmp_path, model=model, optimizer=optimizer, scheduler=scheduler, scaler=scaler,
                          loader=loader, every_n_steps=EVERY, async_save=async_save) as ckpt:
            start = ckpt.resume()
            assert start == start_expected
            losses.update(example.run(parts, ckpt, start, stop))
            ckpt.save(stop - 1)
    assert losses == straight_losses
    step, state = final_state(tmp_path)
    assert step == TOTAL - 1
    for key in ("model", "optimizer", "scheduler", "scaler", "ranks", "progress"):
        assert_same(state[key], straight_state[key], key)
    assert scaler.is_enabled() and state["scaler"]["scale"] > 0


def start_child(argv, prelude=""):
    code = prelude + "import runpy, sys\nsys.argv = sys.argv[1:]\nrunpy.run_path(sys.argv[0], run_name='__main__')\n"
    return subprocess.Popen([sys.executable, "-c", code, str(EXAMPLE), *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=dict(os.environ))


def read_until(child, marker: str) -> str:
    seen = []
    for line in child.stdout:
        seen.append(line)
        if line.startswith(marker):
            return "".join(seen)
    child.wait()
    raise AssertionError(f"the child ended (rc {child.returncode}) before {marker!r}:\n{''.join(seen)}")


def kill(child) -> str:
    os.kill(child.pid, signal.SIGKILL)
    rest = child.stdout.read()
    assert child.wait() == -signal.SIGKILL
    return rest


def resume_and_compare(path, straight, printed_before: str, expect_from: int):
    straight_losses, (straight_step, straight_state) = straight
    with mvc.Repository.open(path) as repo:
        lock = repo.locks.get("main")
        assert lock is not None and lock.stale  # the killed run's lock, lapsed with its process
        assert repo.get_commit("HEAD").step == expect_from - 1
    out = run_in_process(args_for(path))
    assert f"resumed from step {expect_from} " in out
    for losses in (losses_in(printed_before), losses_in(out)):
        assert losses and all(losses[s] == straight_losses[s] for s in losses)
    assert sorted(losses_in(out)) == list(range(expect_from, TOTAL))
    step, state = final_state(path)
    assert step == straight_step
    for key in ("model", "optimizer", "scheduler", "scaler", "ranks", "progress"):
        assert_same(state[key], straight_state[key], key)


def test_sigkill_after_a_commit_then_resume_in_a_new_process(tmp_path, straight):
    # --sleep keeps the child training past the commit until the kill lands
    child = start_child(args_for(tmp_path, "--sleep", "0.03"))
    try:
        printed = read_until(child, f"committed step {EVERY - 1}:")
        printed += kill(child)
    finally:
        child.kill()
    with mvc.Repository.open(tmp_path) as repo:
        tip = repo.get_commit("HEAD").step
    assert tip in (EVERY - 1, 2 * EVERY - 1)  # the kill may land after the next commit on a slow machine
    resume_and_compare(tmp_path, straight, printed, tip + 1)


SLOW_DISK = """
import sys, time, mvc
_commit = mvc.Repository.commit
def slow_commit(self, state, *args, **kwargs):
    if kwargs.get("step") == {step}:
        sys.stdout.write("SAVING\\n")  # one write: the loop prints its lines meanwhile
        sys.stdout.flush()
        time.sleep(120)  # a disk this slow: the kill lands while the save is in flight
    return _commit(self, state, *args, **kwargs)
mvc.Repository.commit = slow_commit
"""


def test_sigkill_during_an_async_save_keeps_the_previous_commit(tmp_path, straight):
    child = start_child(args_for(tmp_path), SLOW_DISK.replace("{step}", str(2 * EVERY - 1)))
    try:
        printed = read_until(child, "SAVING")
        assert f"committed step {EVERY - 1}:" in printed
        printed += read_until(child, f"step {2 * EVERY + 5} loss")  # training goes on meanwhile
        printed += kill(child)
    finally:
        child.kill()
    resume_and_compare(tmp_path, straight, printed, EVERY)
