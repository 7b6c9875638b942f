"""A tiny training run with mvc checkpoints: start it, stop it, start it again.

    python examples/train.py --repo demo            # trains, committing every 50 steps
    (press Ctrl-C, or kill it)
    python examples/train.py --repo demo            # "resumed from step N", same losses
    mvc log; mvc show HEAD                          # run inside demo/

A small MLP with dropout learns a synthetic classification task from a
plain shuffling DataLoader, with AdamW, a cosine LR schedule and a
GradScaler. The Checkpointer is given the loader, so a run stopped in the
middle of an epoch resumes bit for bit as if never stopped.
"""

import argparse
import random
import sys
import threading
import time

import numpy as np
import torch
from torch.utils.data import DataLoader, TensorDataset

from mvc_hooks import Checkpointer

FEATURES, CLASSES, SAMPLES, BATCH = 16, 4, 512, 32


def dataset(seed: int) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(SAMPLES, FEATURES, generator=generator)
    w = torch.randn(FEATURES, CLASSES, generator=generator)
    return TensorDataset(x, (x @ w).argmax(dim=1))


def build(args):
    """Model, optimizer, scheduler, scaler and loader, fresh."""
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    model = torch.nn.Sequential(torch.nn.Linear(FEATURES, 64), torch.nn.ReLU(), torch.nn.Dropout(0.2),
                                torch.nn.Linear(64, CLASSES))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.steps)
    scaler = torch.amp.GradScaler("cpu")
    loader = DataLoader(dataset(args.seed), batch_size=BATCH, shuffle=True)
    return model, optimizer, scheduler, scaler, loader


_OUT = threading.Lock()


def say(text: str) -> None:
    """Print one whole line: the commit callback runs in the save thread, beside the loop's lines."""
    with _OUT:
        sys.stdout.write(text + "\n")
        sys.stdout.flush()


def run(parts, ckpt, step: int, stop: int, log_every: int = 0, sleep: float = 0.0) -> dict:
    """Train from ``step`` up to ``stop``, reporting each step to ``ckpt``; {step: loss}."""
    model, optimizer, scheduler, scaler, loader = parts
    losses = {}
    while step < stop:
        for x, y in loader:  # after a resume, the rest of the checkpoint's epoch comes first
            loss = torch.nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            scheduler.step()
            losses[step] = loss.item()
            if log_every and step % log_every == 0:
                say(f"step {step} loss {loss.item()!r}")
            ckpt.step(step, loss=loss.item(), epoch=step // len(loader))
            step += 1
            time.sleep(sleep)
            if step >= stop:
                break
    return losses


def train(args) -> int:
    parts = build(args)
    model, optimizer, scheduler, scaler, loader = parts

    def committed(commit):
        say(f"committed step {commit.step}: {commit.short_id} "
            f"({commit.stats.bytes_new} new bytes of {commit.stats.bytes_total})")

    with Checkpointer(args.repo, model=model, optimizer=optimizer, scheduler=scheduler, scaler=scaler,
                      loader=loader, branch=args.branch, every_n_steps=args.every,
                      async_save=not args.sync, on_commit=committed,
                      context={"batch_size": BATCH, "grad_accumulation": 1, "seed": args.seed}) as ckpt:
        start = ckpt.resume()
        if start:
            say(f"resumed from step {start} (commit {ckpt.resumed_from.short_id})")
        try:
            run(parts, ckpt, start, args.steps, args.log_every, args.sleep)
            ckpt.save(args.steps - 1)  # the last step, unless the policy committed it already
        except KeyboardInterrupt:
            ckpt.close()  # lets the save in flight finish
            last = f"step {ckpt.last_commit.step}" if ckpt.last_commit else "none yet"
            say(f"\ninterrupted; the last commit is {last}: run the same command again to resume")
            return 130
    say(f"done: {args.steps} steps, last commit {ckpt.last_commit.short_id}")
    return 0


def parse(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", default="mvc-demo", help="repository directory (created if missing)")
    parser.add_argument("--branch", default=None, help="branch to commit to (default: HEAD's)")
    parser.add_argument("--steps", type=int, default=300, help="total training steps")
    parser.add_argument("--every", type=int, default=50, help="commit every N steps")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sync", action="store_true", help="commit in the training thread")
    parser.add_argument("--log-every", type=int, default=25, help="print the loss every N steps")
    parser.add_argument("--sleep", type=float, default=0.01,
                        help="seconds to pause per step, so there is time to press Ctrl-C")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse(argv)
    torch.set_num_threads(args.threads)
    return train(args)


if __name__ == "__main__":
    sys.exit(main())
