"""The training context recorded in every commit without the user writing it.

The **context** is a nested dict of plain values in sections: ``hardware``,
``software``, ``distributed``, ``code`` (git commit and dirty flag of the
training script's repository, entry script, argv), ``model``,
``optimizer`` (hyperparameters per parameter group), ``scheduler``,
``amp``, ``data``, ``seed``, ``timing`` and ``loss`` (a summary of the loss
curve since the previous commit). ``machine()`` and ``code()`` are read once
per run; the rest at each commit. Keys the user passes as ``context`` are
kept at the top level beside the sections.
"""

import os
import platform
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

import numpy as np
import torch

import mvc

from .state import unwrap

GIT_TIMEOUT = 10.0


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _ram_bytes() -> Optional[int]:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def _usable_cpus() -> Optional[int]:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count()


def _gpus() -> dict:
    if not torch.cuda.is_available():
        return {"gpu_count": 0}
    if not torch.cuda.is_initialized():  # reading properties would create a context on every GPU
        return {"gpu_count": torch.cuda.device_count()}
    props = [torch.cuda.get_device_properties(i) for i in range(torch.cuda.device_count())]
    return {"gpu_count": len(props), "gpu_names": [p.name for p in props],
            "gpu_memory_bytes": [p.total_memory for p in props],
            "gpu_capability": [f"{p.major}.{p.minor}" for p in props]}


def machine() -> dict:
    """Hardware and software of this process's machine."""
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    hardware = {"cpu_model": _cpu_model(), "cpu_count": os.cpu_count(), "cpus_usable": _usable_cpus(),
                "ram_bytes": _ram_bytes(), "arch": platform.machine(), "hostname": socket.gethostname(),
                **_gpus()}
    software = {"python": platform.python_version(), "python_implementation": platform.python_implementation(),
                "torch": torch.__version__, "torch_git": torch.version.git_version, "numpy": np.__version__,
                "mvc": mvc.__version__, "os": platform.system(), "os_release": platform.release(),
                "platform": platform.platform(), "cuda": torch.version.cuda, "cudnn": cudnn,
                "torch_threads": torch.get_num_threads(), "torch_interop_threads": torch.get_num_interop_threads(),
                "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
                "cudnn_benchmark": torch.backends.cudnn.benchmark,
                "cudnn_deterministic": torch.backends.cudnn.deterministic,
                "float32_matmul_precision": torch.get_float32_matmul_precision(),
                "mkldnn": torch.backends.mkldnn.is_available()}
    return {"hardware": hardware, "software": software}


def _git(args: list, cwd: Path) -> Optional[str]:
    try:
        done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=GIT_TIMEOUT)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def entry_script() -> Optional[str]:
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None) or (sys.argv[0] if sys.argv and sys.argv[0] else None)
    return path if path and path != "-c" else None


def code() -> dict:
    """Which code runs: the entry script, argv, and the git state of its repository."""
    script = entry_script()
    where = Path(script).resolve().parent if script and Path(script).exists() else Path.cwd()
    commit = _git(["rev-parse", "HEAD"], where)
    out = {"entry_script": script, "argv": list(sys.argv), "executable": Path(sys.executable).name,
           "pid": os.getpid(), "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "git_commit": commit}
    if commit is not None:
        status = _git(["status", "--porcelain", "--untracked-files=no"], where)
        out["git_dirty"] = None if status is None else bool(status)
        out["git_branch"] = _git(["rev-parse", "--abbrev-ref", "HEAD"], where)
    return {"code": out}


def _model(components) -> dict:
    out = {}
    for key, model in components.each("model"):
        model = unwrap(model)
        name = str(key) if key is not None else "main"
        if not isinstance(model, torch.nn.Module):
            out[name] = {"class": type(model).__name__}
            continue
        params = list(model.parameters())
        out[name] = {
            "class": type(model).__name__,
            "parameters": sum(p.numel() for p in params),
            "trainable_parameters": sum(p.numel() for p in params if p.requires_grad),
            "dtypes": sorted({str(p.dtype) for p in params}),
            "devices": sorted({str(p.device) for p in params}),
        }
    return out


def _hyperparameters(group: dict) -> dict:
    out = {}
    for key, value in group.items():
        if isinstance(value, torch.Tensor) and value.numel() == 1:  # lr as a tensor (capturable runs)
            value = value.item()
        if key != "params" and isinstance(value, (bool, int, float, str, tuple, list)):
            out[key] = value
    return out


def _optimizer(components) -> dict:
    out = {}
    for key, opt in components.each("optimizer"):
        if not isinstance(opt, torch.optim.Optimizer):
            continue
        groups = [{"params": sum(p.numel() for p in g["params"]), **_hyperparameters(g)}
                  for g in opt.param_groups]
        out[str(key) if key is not None else "main"] = {"class": type(opt).__name__, "param_groups": groups}
    return out


def _scheduler(components) -> dict:
    out = {}
    for key, sched in components.each("scheduler"):
        entry = {"class": type(sched).__name__}
        last_lr = getattr(sched, "_last_lr", None)
        if isinstance(last_lr, list):
            entry["last_lr"] = [float(v) for v in last_lr]
        epoch = getattr(sched, "last_epoch", None)
        if isinstance(epoch, int):
            entry["last_epoch"] = epoch
        out[str(key) if key is not None else "main"] = entry
    return out


def _amp(components) -> dict:
    out = {"default_dtype": str(torch.get_default_dtype())}
    for key, scaler in components.each("scaler"):
        enabled = scaler.is_enabled() if hasattr(scaler, "is_enabled") else None
        entry = {"class": type(scaler).__name__, "enabled": enabled}
        if enabled:
            entry["scale"] = float(scaler.get_scale())
            entry["growth_interval"] = scaler.get_growth_interval()
        out[str(key) if key is not None else "scaler"] = entry
    return out


def _data(sampler, progress: dict) -> dict:
    out = {k: v for k, v in progress.items() if v is not None}
    if sampler is not None:
        entry = {"class": type(sampler).__name__}
        for name in ("epoch", "position", "num_samples", "seed", "shuffle"):
            if isinstance(getattr(sampler, name, None), (bool, int, float)):
                entry[name] = getattr(sampler, name)
        out["sampler"] = entry
    return out


def timing(obs, started: float) -> dict:
    """Wall time, speed and checkpoint cost, from the policy's observation."""
    out = {"wall_time_s": obs.elapsed, "started_unix": started,
           "steps_since_commit": obs.steps_since_commit, "seconds_since_commit": obs.seconds_since_commit,
           "checkpoint_blocked_s": obs.blocked}
    if obs.seconds_since_commit > 0:
        out["steps_per_s"] = obs.steps_since_commit / obs.seconds_since_commit
    if obs.save_cost is not None:
        out["last_save_blocked_s"] = obs.save_cost
    if obs.elapsed > 0:
        out["checkpoint_overhead"] = obs.blocked / obs.elapsed
    return out


def commit_context(static: dict, components, sampler, progress: dict, obs, started: float,
                   distributed: dict, user: dict) -> dict:
    """Everything a commit records: the run's static part plus this step's."""
    context = dict(static)
    context.update({"distributed": distributed, "model": _model(components),
                    "optimizer": _optimizer(components), "scheduler": _scheduler(components),
                    "amp": _amp(components), "data": _data(sampler, progress),
                    "seed": {"torch_initial_seed": torch.initial_seed()},
                    "timing": timing(obs, started), "loss": obs.losses.as_context()})
    context.update(user)
    return context

