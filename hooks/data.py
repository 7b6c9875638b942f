"""The data position of a training loop, kept exactly across a resume.

A DataLoader draws random numbers when an **iteration** (one pass, one
``iter(loader)``) starts: a base seed for its workers, and the shuffle of a
``RandomSampler`` that has no generator of its own, both from the global
torch RNG unless the loader has a ``generator``. A checkpoint taken in the
middle of an iteration restores the RNG as it was at that step, so a
resumed run that starts the iteration again draws from another state than
the uninterrupted run did: another shuffle, and other dropout masks from
there on. The **position** is how many batches the current iteration has
handed to the loop.

``LoaderTracker`` keeps what an iteration started from (the torch RNG, the
loader's and sampler's generators, the sampler's state and epoch) and its
position, and after a resume it replays the start of that iteration:

- the iteration's draws are made from the states they were made from, and
  the RNG is set back to the checkpoint's right before the first batch the
  loop trains on, so every later draw matches;
- the batches already seen are skipped: by the tracker (index by index
  without loading them when ``num_workers=0``; loaded by the workers and
  dropped otherwise, so each worker's RNG stream matches), or, with
  ``loop_skips=True``, by the loop that iterates past them (from the
  checkpoint's epoch or from the first one).

A torchdata StatefulDataLoader is tracked the same way, not restored from
its own state_dict: that restarts its workers with fresh random streams,
so a dataset that draws random numbers as it loads would not continue
exactly.

A pass the loop left early (``break``, a stop) is continued by a resume,
as the run would have gone on in it had it not stopped there.

The first ``step()`` after a resume checks that the loop took as many
batches as the checkpointed run took per step, so a loop that skips twice,
or not at all, is an error and not a quiet drift.

The tracked loader's class is swapped for a subclass whose ``__iter__``
does the above (``close()`` swaps it back), so the loop iterates the same
object as before. ``watch`` wraps ``DataLoader.__iter__`` to note loaders
the Checkpointer was not given; a checkpoint taken while one of them is in
the middle of an iteration records it, and a resume refuses it with what to
change instead of resuming into a drift.
"""

import copy
import sys
import threading
import weakref
from typing import Optional

import torch
from torch.utils.data import DataLoader

import mvc

# -- loaders the Checkpointer was not given ---------------------------------

_SEEN: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # loader -> weakref to its iterator
_PATCHED: set = set()
_PATCH_LOCK = threading.Lock()


def watch() -> None:
    """Note every DataLoader iteration from now on (idempotent; cheap: one dict store per pass)."""
    classes = [DataLoader]
    stateful = sys.modules.get("torchdata.stateful_dataloader")
    if stateful is not None and hasattr(stateful, "StatefulDataLoader"):
        classes.append(stateful.StatefulDataLoader)
    with _PATCH_LOCK:
        for cls in classes:
            if cls not in _PATCHED and "__iter__" in cls.__dict__:
                cls.__iter__ = _watching(cls.__dict__["__iter__"])
                _PATCHED.add(cls)


def _watching(original):
    def __iter__(self):
        it = original(self)
        if "_mvc_tracker" not in self.__dict__:
            try:
                _SEEN[self] = weakref.ref(it)
            except TypeError:  # an iterator that cannot be weakly referenced: not one of torch's
                pass
        return it
    __iter__.__wrapped__ = original
    return __iter__


def untracked(registered: list) -> list:
    """Descriptions of untracked loaders in the middle of an iteration that a resume would not continue.

    A loader resumes exactly without tracking only when its own sampler
    (or the loader itself) is a restored ``sampler=`` component, it has a
    generator of its own and no worker processes.
    """
    found = []
    for loader, ref in list(_SEEN.items()):
        it = ref()
        position = _yielded(it)
        length = _length(loader)
        if it is None or not position or (length is not None and position >= length):
            continue
        restored = any(obj is loader or obj is getattr(loader, "sampler", None)
                       or obj is getattr(loader, "batch_sampler", None) for obj in registered)
        if restored and loader.generator is not None and loader.num_workers == 0:
            continue
        found.append(describe(loader, position, length))
    return found


def describe(loader, position=None, length=None) -> str:
    dataset = type(loader.dataset).__name__
    size = _dataset_length(loader)
    where = f"{dataset} of {size} samples" if size is not None else dataset
    at = "" if position is None else f", at batch {position} of {length if length is not None else '?'}"
    gen = "no generator" if loader.generator is None else "its own generator"
    return f"{type(loader).__name__} over {where}, {type(loader.sampler).__name__}, {gen}, " \
           f"num_workers={loader.num_workers}{at}"


# -- the tracker -------------------------------------------------------------

_CLASSES: dict = {}


def _tracked_class(base: type) -> type:
    if base not in _CLASSES:
        def __iter__(self):
            return self.__dict__["_mvc_tracker"].iterate(lambda: base.__iter__(self))
        _CLASSES[base] = type(base.__name__, (base,), {"__iter__": __iter__, "__module__": base.__module__,
                                                        "__qualname__": base.__qualname__})
    return _CLASSES[base]


def _length(loader) -> Optional[int]:
    try:
        return len(loader)
    except TypeError:  # an IterableDataset without __len__
        return None


def _dataset_length(loader) -> Optional[int]:
    try:
        return len(loader.dataset)
    except TypeError:
        return None


def _yielded(it) -> Optional[int]:
    return None if it is None else getattr(it, "_num_yielded", None)


def _samplers(loader) -> list:
    """The loader's index samplers, outermost first."""
    out = []
    batch = getattr(loader, "batch_sampler", None)
    if batch is not None:
        out.append(batch)
        inner = getattr(batch, "sampler", None)
        if inner is not None:
            out.append(inner)
    sampler = getattr(loader, "sampler", None)
    if sampler is not None and all(sampler is not s for s in out):
        out.append(sampler)
    return out


def _generators(loader) -> list:
    """The distinct torch.Generators the loader and its samplers draw from."""
    found = []
    for obj in [loader, *_samplers(loader)]:
        g = getattr(obj, "generator", None)
        if isinstance(g, torch.Generator) and all(g is not f for f in found):
            found.append(g)
    return found


def _epoch_of(loader) -> Optional[int]:
    for sampler in _samplers(loader):
        epoch = getattr(sampler, "epoch", None)
        if isinstance(epoch, int) and not isinstance(epoch, bool):
            return epoch
    return None


class _RestoreAfter:
    """An index iterator that sets the torch RNG once ``pulls`` indices have been taken.

    With ``num_workers=0`` a batch is fetched right after its index is
    taken, so this puts the checkpoint's RNG in place just before the loop's
    first trained batch is loaded.
    """

    def __init__(self, inner, pulls: int, state: torch.Tensor):
        self.inner, self.left, self.state = inner, pulls, state

    def __iter__(self):
        return self

    def __next__(self):
        index = next(self.inner)
        self.left -= 1
        if self.left == 0:
            torch.set_rng_state(self.state)
        return index


class LoaderTracker:
    """Tracks one DataLoader's iterations and resumes its position exactly (see the module doc).

    ``registered`` are the Checkpointer's ``sampler=`` components: a
    sampler among them is restored by the Checkpointer, and the tracker
    winds it back to where the checkpoint's iteration started.
    """

    def __init__(self, loader, registered: list, loop_skips: bool = False):
        if not isinstance(loader, DataLoader):
            raise mvc.BadInput(f"loader= takes a torch DataLoader (or a StatefulDataLoader), "
                               f"not a {type(loader).__name__}")
        if "_mvc_tracker" in loader.__dict__:
            raise mvc.BadInput("this DataLoader is already tracked by another Checkpointer")
        if loader.num_workers > 0 and loader.persistent_workers:
            raise mvc.BadInput("loader= has persistent_workers=True: its workers' random streams run on "
                               "across epochs and no checkpoint can hold them, so a resume could not be "
                               "exact; use persistent_workers=False")
        if any(obj is loader for obj in registered):
            raise mvc.BadInput("the loader is given as both loader= and sampler=: give it as loader= only "
                               "(the Checkpointer then resumes its position itself)")
        self.loader = loader
        self.loop_skips = loop_skips
        self.restored_sampler = next((s for s in _samplers(loader) if any(s is r for r in registered)), None)
        self._iterator = None  # weakref to the current iteration's iterator
        self._start: Optional[dict] = None  # what the current iteration started from
        self._armed: Optional[dict] = None  # the checkpoint's iteration, until it is replayed
        self._resume_rng: Optional[torch.Tensor] = None
        self._check_first: Optional[dict] = None  # what the first step after a resume must see
        self._step_at: tuple = (None, None)  # (iterator ref, position) at the last step()
        self.per_step: Optional[int] = None
        self._base = type(loader)
        loader._mvc_tracker = self
        loader.__class__ = _tracked_class(self._base)

    def close(self) -> None:
        """Give the loader its own class back."""
        loader = self.loader
        if loader.__dict__.get("_mvc_tracker") is self:
            loader.__class__ = self._base
            del loader.__dict__["_mvc_tracker"]

    # -- iterating -----------------------------------------------------------

    def _capture(self) -> dict:
        sampler = self.restored_sampler
        return {"rng": torch.get_rng_state(), "generators": [g.get_state() for g in _generators(self.loader)],
                "sampler": None if sampler is None else copy.deepcopy(sampler.state_dict()),
                "epoch": _epoch_of(self.loader)}

    def position(self) -> Optional[int]:
        """Batches the current iteration has handed out; None outside an iteration."""
        return _yielded(self._iterator() if self._iterator is not None else None)

    def iterate(self, start):
        """``iter(loader)``: a fresh iteration, or the replay of the checkpoint's."""
        armed = self._armed
        if armed is None:
            self._start = self._capture()
            it = start()
        else:
            it = self._replay(armed, start)
        self._iterator = weakref.ref(it)
        return it

    def _replay(self, armed: dict, start):
        if self._resume_rng is None:
            self._resume_rng = torch.get_rng_state()  # as resume() restored it
        resume_rng = self._resume_rng
        position = armed["position"]
        if not self.loop_skips:
            self._armed = None  # the tracker (or the loader) positions this one iteration
            epoch = _epoch_of(self.loader)
            if armed["start"]["epoch"] is not None and epoch != armed["start"]["epoch"]:
                raise mvc.BadInput(f"the loop starts epoch {epoch} of the loader, but the checkpoint is in "
                                   f"epoch {armed['start']['epoch']} at batch {position}: start the loop at "
                                   "that epoch (ckpt.epoch, from step(epoch=...)) and call set_epoch with it")
        self._start = armed["start"]
        rng = armed["start"]["rng"]
        torch.set_rng_state(resume_rng if rng is None else rng)
        for g, state in zip(_generators(self.loader), armed["start"]["generators"]):
            g.set_state(state)
        if not position:  # the checkpoint was at an iteration's end: the next one starts from its RNG
            return start()
        it = start()
        if self.loader.num_workers > 0:
            # every draw of the iteration's start has happened (workers prefetch in iter())
            torch.set_rng_state(resume_rng)
            if not self.loop_skips:
                for _ in range(position):  # the workers load and drop them: their RNG streams match
                    next(it)
        elif self.loop_skips:
            it._sampler_iter = _RestoreAfter(it._sampler_iter, position + 1, resume_rng)
        else:
            for _ in range(position):  # indices only: nothing is loaded
                it._next_index()
            it._num_yielded = position
            torch.set_rng_state(resume_rng)
        return it

    # -- the Checkpointer's calls ----------------------------------------------

    def on_step(self, step: int, expected_step: Optional[int]) -> None:
        """A finished step: count its batches; after a resume, check the loop took the right ones."""
        ref = self._iterator
        position = self.position()
        prev_ref, prev_position = self._step_at
        if position is not None:
            same = prev_ref is not None and ref is prev_ref and prev_position is not None
            self.per_step = position - prev_position if same else position
        self._step_at = (ref, position)
        check, self._check_first = self._check_first, None
        if check is None:
            return
        self._armed = None
        if expected_step is not None and step != expected_step:
            raise mvc.BadInput(
                f"the first step reported after resume() is {step}, but resume() returned {expected_step}: "
                f"the loader's next pass continues the checkpoint's epoch at batch {check['skipped']}, so "
                "count steps on from resume()'s value, or pass loop_skips=True if the loop iterates past "
                "the seen batches itself")
        if position is None:
            raise mvc.BadInput("the loop did not iterate the DataLoader given as loader= before its first "
                               "step after resume(): give the Checkpointer the loader the loop trains from")
        want = check["skipped"] + check["per_step"]
        if check["per_step"] is not None and position != want:
            if self.loop_skips:
                hint = (f"with loop_skips=True the loop must iterate past the first {check['skipped']} "
                        "batches of the checkpoint's epoch (ckpt.batches_seen) without training on them")
            else:
                hint = ("the Checkpointer already positioned the loader after the seen batches: remove the "
                        "loop's own skipping, or pass loop_skips=True to keep it")
            raise mvc.BadInput(f"after resume() the loop took {position} batches of the loader's pass before "
                               f"its first step, the checkpointed run {want} ({check['skipped']} seen, "
                               f"{check['per_step']} per step): {hint}")

    def state_dict(self) -> dict:
        position = self.position()
        if position is None and self._iterator is not None and self._step_at[0] is self._iterator:
            # The loop left the pass (break) before saving: a resume goes on in it, as the run would
            # have if it had not been stopped there.
            position = self._step_at[1]
        length = _length(self.loader)
        mid = position is not None and position > 0 and (length is None or position < length)
        if mid:
            start = self._start
        else:  # between passes: the next one starts from the RNG the resume restores
            start = {"rng": None, "generators": [g.get_state() for g in _generators(self.loader)],
                     "sampler": None, "epoch": None}
        # the loop trained on the pass's last batch: a resume starts the next pass, in the next epoch
        ended = position is not None and length is not None and position >= length
        state = {"position": position if mid else None, "per_step": self.per_step, "start": start,
                 "length": length, "ended": ended,
                 "dataset": _dataset_length(self.loader), "batch_size": self.loader.batch_size,
                 "num_workers": self.loader.num_workers, "loop_skips": self.loop_skips}
        return state

    def state_problem(self, state) -> Optional[str]:
        if not isinstance(state, dict) or "position" not in state or "dataset" not in state:
            return "the saved state is not a loader state"
        mine = {"dataset": _dataset_length(self.loader), "length": _length(self.loader),
                "batch_size": self.loader.batch_size}
        names = {"dataset": "samples in its dataset", "length": "batches per pass", "batch_size": "batch size"}
        for key, here in mine.items():
            if state[key] != here:
                return (f"the loader has {here} {names[key]}, the checkpoint's had {state[key]}: its saved "
                        "position would point at other samples; resume with the dataset and loader the run "
                        "used, or start a new branch")
        if state["num_workers"] != self.loader.num_workers:
            return (f"the loader has num_workers={self.loader.num_workers}, the checkpoint's had "
                    f"{state['num_workers']}: workers draw random numbers of their own, so the run would "
                    "not continue exactly; use the same num_workers")
        return None

    def load_state_dict(self, state: dict) -> None:
        """Arm the replay of the checkpoint's iteration (after state_problem)."""
        problem = self.state_problem(state)
        if problem:
            raise mvc.BadInput(problem)
        self.per_step = state["per_step"]
        self._resume_rng = None
        self._step_at = (None, None)
        start = state["start"]
        if start["sampler"] is not None and self.restored_sampler is not None:
            self.restored_sampler.load_state_dict(start["sampler"])  # wound back to the pass's start
        self._armed = {"position": state["position"], "start": start}
        self._check_first = {"skipped": state["position"] or 0, "per_step": state["per_step"]}

    @property
    def batches_seen(self) -> int:
        """Batches of the checkpoint's pass the loop had trained on (what a loop_skips loop skips)."""
        return 0 if self._check_first is None else self._check_first["skipped"]
