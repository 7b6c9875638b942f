"""The components of a run, and their state as one checkpoint tree.

A **component** is a live object whose state a checkpoint holds: a model,
an optimizer, an LR scheduler, a GradScaler, a sampler, or any object with
``state_dict()``/``load_state_dict()`` (``torch.Generator`` too). A
**group** is one keyword of the Checkpointer (``model``, ``optimizer``,
...) holding one component, a list of them or a dict of them; the
checkpoint mirrors that shape, so ``state["model"]`` of a single model is a
plain state dict that loads into a bare model. Models wrapped in
DistributedDataParallel, DataParallel or ``torch.compile`` are saved
without their wrapper's key prefix.

``check`` compares a loaded checkpoint with the live components before
anything is loaded, so a mismatch is an error and never a partial restore:
key sets, shapes and dtypes of model tensors, optimizer parameter groups
(their count, sizes and hyperparameter keys), optimizer state shapes, and
the class of every optimizer, scheduler and scaler (``types`` records them
in the checkpoint). A component may define ``state_problem(state)``,
returning what makes a saved state unfit for it (a str) or None; ``check``
asks it too (ResumableSampler does). ``load`` loads the small components
first and the models last, and puts back what it had loaded if a
component's own loader still fails.
"""

import copy

import threading
from collections import OrderedDict
from typing import Any, Callable, Iterator, Optional

import torch

import mvc

GROUPS = ("model", "optimizer", "scheduler", "scaler", "stateful", "sampler", "loader")

# Groups whose class the checkpoint records and a resume insists on: another
# optimizer or scheduler class would take the state and compute something else.
TYPED = ("optimizer", "scheduler", "scaler")

# Load order: the cheap components first, so a failing one is rolled back
# cheaply; the models last, as nothing after them can fail.
LOAD_ORDER = ("sampler", "loader", "stateful", "scaler", "scheduler", "optimizer", "model")


def unwrap(model):
    """The module that holds the weights, without DDP/DataParallel/compile wrappers."""
    while True:
        if isinstance(model, (torch.nn.parallel.DistributedDataParallel, torch.nn.DataParallel)):
            model = model.module
        elif isinstance(getattr(model, "_orig_mod", None), torch.nn.Module):
            model = model._orig_mod
        else:
            return model


def members(value) -> Iterator[tuple]:
    """(key, component) of a group: key None for a single component."""
    if isinstance(value, dict):
        yield from value.items()
    elif isinstance(value, (list, tuple)):
        yield from enumerate(value)
    else:
        yield None, value


def _name(group: str, key) -> str:
    return group if key is None else f"{group}[{key!r}]"


def _check_component(group: str, key, obj) -> None:
    if isinstance(obj, torch.Generator):
        return
    if not (callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None))):
        raise mvc.BadInput(f"{_name(group, key)} is a {type(obj).__name__}, which has no "
                           "state_dict()/load_state_dict(); pass its state in extra= instead")


class Components:
    """The live components of a run, by group; groups given as None are left out."""

    def __init__(self, **groups):
        self.groups = {}
        for group, value in groups.items():
            if value is None:
                continue
            if isinstance(value, (dict, list, tuple)) and not value:
                continue
            if isinstance(value, dict) and not all(isinstance(k, str) for k in value):
                raise mvc.BadInput(f"the {group} dict must have str keys")
            for key, obj in members(value):
                _check_component(group, key, obj)
            self.groups[group] = value

    def get(self, group: str):
        return self.groups.get(group)

    def each(self, group: str) -> Iterator[tuple]:
        if group in self.groups:
            yield from members(self.groups[group])

    def state(self) -> dict:
        """{group: state of its component(s), in the group's shape} (live tensors)."""
        return {group: _shaped(value, lambda key, obj, g=group: state_of(g, obj))
                for group, value in self.groups.items()}

    def types(self) -> dict:
        """{group: class name(s), in the group's shape} of the groups whose class a resume checks."""
        return {group: _shaped(value, lambda key, obj: type(obj).__qualname__)
                for group, value in self.groups.items() if group in TYPED}

    def check(self, saved: dict, where: str, strict: bool = True) -> None:
        """Raise mvc.BadInput unless ``saved`` has a matching state for every component.

        With ``strict``, a saved group no component was given for is an
        error too (it would be silently dropped).
        """
        for group, value in self.groups.items():
            if group not in saved:
                raise mvc.BadInput(f"{where} has no {group} state, but a {group} was given; "
                                   f"resume from a checkpoint of this run or leave out the {group}")
            _check_shape(group, value, saved[group], where)
            types = saved.get("types", {}).get(group) if isinstance(saved.get("types"), dict) else None
            for key, obj in members(value):
                state = saved[group] if key is None else saved[group][key]
                problem = _type_problem(obj, types, key) or _problem(group, obj, state)
                if problem:
                    raise mvc.BadInput(f"{where}: {_name(group, key)} does not match: {problem}")
        if strict:
            extra = [g for g in GROUPS if g in saved and g not in self.groups]
            if extra:
                raise mvc.BadInput(f"{where} also holds {', '.join(extra)} state that nothing was given "
                                   "for; pass the objects, or strict=False to leave it out")

    def load(self, saved: dict) -> None:
        """Load every component's state (after ``check``); all or nothing.

        If a component's own loader fails, the components loaded before it
        get their previous state back and mvc.BadInput names the one that
        failed. The models load last, so they are never rolled back (and
        never copied).
        """
        order = sorted(self.groups, key=lambda g: LOAD_ORDER.index(g) if g in LOAD_ORDER else -1)
        done = []
        try:
            for group in order:
                for key, obj in members(self.groups[group]):
                    state = saved[group] if key is None else saved[group][key]
                    before = None if group == "model" else copy.deepcopy(state_of(group, obj))
                    _load_one(group, key, obj, state)
                    done.append((group, key, obj, before))
        except BaseException:
            for group, key, obj, before in reversed(done):
                load_into(group, obj, before)
            raise


def _load_one(group: str, key, obj, state) -> None:
    try:
        load_into(group, obj, state)
    except mvc.MvcError:
        raise
    except Exception as exc:  # any component's own loader, e.g. a GradScaler's
        raise mvc.BadInput(f"restoring {_name(group, key)} failed: {exc}") from exc


def _type_problem(obj, types, key) -> Optional[str]:
    """The class recorded in the checkpoint, if it is not the live one's."""
    if isinstance(types, dict):
        saved = types.get(key)
    elif isinstance(types, list):
        saved = types[key] if isinstance(key, int) and key < len(types) else None
    else:
        saved = types
    here = type(obj).__qualname__
    if isinstance(saved, str) and saved != here:
        return f"it is a {saved} in the checkpoint, {here} here; resume with the class the run used"
    return None


def _shaped(value, fn: Callable) -> Any:
    if isinstance(value, dict):
        return {k: fn(k, v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [fn(i, v) for i, v in enumerate(value)]
    return fn(None, value)


def _check_shape(group: str, value, saved, where: str) -> None:
    if isinstance(value, dict):
        if not isinstance(saved, dict) or set(saved) != set(value):
            have = sorted(saved) if isinstance(saved, dict) else type(saved).__name__
            raise mvc.BadInput(f"{where} holds {group} {have}, but {sorted(value)} were given")
    elif isinstance(value, (list, tuple)):
        if not isinstance(saved, list) or len(saved) != len(value):
            have = f"{len(saved)}" if isinstance(saved, list) else "one"
            raise mvc.BadInput(f"{where} holds {have} {group} state(s), but {len(value)} were given")


def state_of(group: str, obj) -> Any:
    if isinstance(obj, torch.Generator):
        return {"generator": obj.get_state()}
    if group == "model":
        return unwrap(obj).state_dict()
    return obj.state_dict()


def load_into(group: str, obj, state) -> None:
    if isinstance(obj, torch.Generator):
        obj.set_state(state["generator"].cpu())
    elif group == "model":
        unwrap(obj).load_state_dict(state, strict=True)
    else:
        obj.load_state_dict(state)


def _problem(group: str, obj, state) -> Optional[str]:
    """What makes ``state`` unfit for ``obj``, or None."""
    if isinstance(obj, torch.Generator):
        ok = isinstance(state, dict) and isinstance(state.get("generator"), torch.Tensor)
        return None if ok else "the saved state is not a torch.Generator state"
    if not isinstance(state, dict):
        return f"the saved state is a {type(state).__name__}, not a state dict"
    problem = obj.state_problem(state) if callable(getattr(obj, "state_problem", None)) else None
    if problem:
        return problem
    if group == "model":
        return _model_problem(unwrap(obj), state)
    if isinstance(obj, torch.optim.Optimizer):
        return _optimizer_problem(obj, state)
    if group == "scheduler":
        missing = set(obj.state_dict()) - set(state)
        if missing:
            return f"the saved scheduler state lacks {sorted(missing)} (another scheduler class?)"
    return None


def _listed(keys) -> str:
    keys = sorted(keys)
    return ", ".join(keys[:5]) + (f" and {len(keys) - 5} more" if len(keys) > 5 else "")


def _model_problem(model: torch.nn.Module, state: dict) -> Optional[str]:
    live = model.state_dict()
    missing, unexpected = set(live) - set(state), set(state) - set(live)
    if missing:
        return f"the checkpoint lacks {_listed(missing)}"
    if unexpected:
        return f"the checkpoint has keys the model lacks: {_listed(unexpected)}"
    for key, tensor in live.items():
        saved = state[key]
        if isinstance(tensor, torch.Tensor) and (not isinstance(saved, torch.Tensor) or saved.shape != tensor.shape):
            shape = tuple(saved.shape) if isinstance(saved, torch.Tensor) else type(saved).__name__
            return f"{key} has shape {shape} in the checkpoint but {tuple(tensor.shape)} in the model"
        if isinstance(tensor, torch.Tensor) and saved.dtype != tensor.dtype:
            # load_state_dict would cast silently: not the checkpoint's values
            return (f"{key} is {_dtype(saved.dtype)} in the checkpoint but {_dtype(tensor.dtype)} in the model; "
                    "build the model in the checkpoint's dtype (model.to(...)) before resuming")
    return None


def _dtype(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def _optimizer_problem(opt: torch.optim.Optimizer, state: dict) -> Optional[str]:
    groups, saved_groups = opt.param_groups, state.get("param_groups")
    if not isinstance(saved_groups, list) or not isinstance(state.get("state"), dict):
        return "the saved state is not an optimizer state (no param_groups/state)"
    if len(saved_groups) != len(groups):
        return f"{len(saved_groups)} parameter groups in the checkpoint, {len(groups)} here"
    params = {}
    for i, (group, saved) in enumerate(zip(groups, saved_groups)):
        if not isinstance(saved, dict):
            return f"parameter group {i} in the checkpoint is not a dict"
        # A newer torch may add hyperparameters (defaults fill them in); a key
        # this optimizer lacks means the state is another optimizer's.
        foreign = set(saved) - set(group)
        if foreign:
            return (f"parameter group {i} has {_listed(map(str, foreign))} in the checkpoint, which "
                    f"{type(opt).__qualname__} lacks (another optimizer class?)")
        ids = saved.get("params", [])
        if len(ids) != len(group["params"]):
            return f"parameter group {i} has {len(ids)} parameters in the checkpoint, {len(group['params'])} here"
        params.update(zip(ids, group["params"]))
    for pid, per_param in state["state"].items():
        param = params.get(pid)
        if param is None:
            return f"the checkpoint has state for parameter {pid}, which no group lists"
        for name, value in per_param.items():
            # Moment buffers are shaped like their parameter; factored ones
            # (Adafactor) have size-1 dims and broadcast to it.
            if isinstance(value, torch.Tensor) and value.dim() == param.dim() > 0:
                if any(v not in (1, p) for v, p in zip(value.shape, param.shape)):
                    return (f"state {name!r} of parameter {pid} has shape {tuple(value.shape)}, "
                            f"the parameter {tuple(param.shape)}")
    return None


class TornSnapshot(mvc.MvcError):
    """A tensor changed in place while its deferred copy was being taken."""


class Snapshot:
    """Copies of a state's tensors in CPU memory that training cannot change.

    The copy buffers are kept and reused by the next snapshot (at most one
    save is in flight, and the next snapshot waits for it), so a save does
    not allocate and fault in fresh memory every time. Tensors on CUDA go to
    pinned buffers with non-blocking copies; ``wait()`` blocks until those
    copies have landed. Tensors that share storage (tied weights) stay
    shared in the copy.

    A CPU tensor for which ``take``'s ``defer(tensor)`` is true (parameters
    and optimizer state: only an optimizer step changes them) gets its
    buffer at once but is copied by ``fill()``, which the save thread runs
    while training goes on; the training thread calls ``filled()`` before
    anything may change those tensors (the Checkpointer does it before every
    optimizer step and every checkpoint call). ``fill`` compares each
    tensor's version counter with the one it had at ``take`` and raises
    TornSnapshot if it changed in place meanwhile, so a torn copy is an
    error, never a commit.
    """

    def __init__(self):
        self._buffers: dict = {}
        self._events: list = []
        self._deferred: list = []  # (source, version at take, buffer, key path)
        self._filled = threading.Event()
        self._filled.set()

    def take(self, state, defer: Optional[Callable] = None) -> Any:
        self._events = []
        self._deferred = []
        memo: dict = {}
        devices: set = set()
        copy = self._copy(state, (), memo, devices, defer)
        for device in devices:  # copies were queued on each device's current stream
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream(device))
            self._events.append(event)
        if self._deferred:
            self._filled.clear()
        return copy

    def fill(self) -> None:
        """Copy the deferred tensors (in the save thread); then wait for the CUDA copies."""
        try:
            for source, version, buffer, path in self._deferred:
                buffer.copy_(source)
                if source._version != version:
                    raise TornSnapshot(
                        f"{'.'.join(map(str, path))} changed in place before its checkpoint copy was taken; "
                        "change parameters and optimizer state only in optimizer steps, or pass "
                        "async_save=False")
        finally:
            self._deferred = []
            self._filled.set()
        self.wait()

    def filled(self) -> None:
        """Block until ``fill`` has copied every deferred tensor."""
        self._filled.wait()

    def wait(self) -> None:
        for event in self._events:
            event.synchronize()
        self._events = []

    def _copy(self, node, path: tuple, memo: dict, devices: set, defer) -> Any:
        if isinstance(node, torch.Tensor):
            key = _alias_key(node)
            if key is not None and key in memo:
                return memo[key]
            out = self._copy_tensor(node, path, devices, defer)
            if key is not None:
                memo[key] = out
            return out
        if isinstance(node, dict):
            return _with_metadata_of(node, {k: self._copy(v, path + (k,), memo, devices, defer)
                                            for k, v in node.items()})
        if isinstance(node, (list, tuple)):
            items = [self._copy(v, path + (i,), memo, devices, defer) for i, v in enumerate(node)]
            return tuple(items) if isinstance(node, tuple) else items
        return node  # plain values are immutable

    def _copy_tensor(self, tensor: torch.Tensor, path: tuple, devices: set, defer) -> torch.Tensor:
        source = tensor.detach()
        cuda = source.device.type == "cuda"
        buffer = self._buffers.get(path)
        if buffer is None or buffer.shape != source.shape or buffer.dtype != source.dtype:
            buffer = torch.empty(source.shape, dtype=source.dtype, pin_memory=cuda)
            self._buffers[path] = buffer
        if not cuda and defer is not None and source.device.type == "cpu" and defer(source):
            # detach() shares the version counter, so fill() sees any in-place change
            self._deferred.append((source, source._version, buffer, path))
            return buffer
        buffer.copy_(source, non_blocking=cuda)
        if cuda:
            devices.add(source.device)
        return buffer


def _with_metadata_of(source: dict, items: dict) -> dict:
    """``items``, as an OrderedDict with a copy of ``source``'s ``_metadata`` (the
    module versions of a ``state_dict()``, which a commit keeps) where it has one."""
    metadata = getattr(source, "__dict__", {}).get("_metadata")
    if metadata is None:
        return items
    out = OrderedDict(items)
    out._metadata = copy.deepcopy(metadata)
    return out


_alias_key = mvc.traverse.storage_key  # tied tensors stay tied in the copy, as in a commit
