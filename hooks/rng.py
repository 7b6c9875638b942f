"""Random number generator states as storable values.

An **RNG state** is a dict holding the state of every global generator a
training step can draw from: Python's ``random``, NumPy's legacy global
generator, torch's CPU generator and, once CUDA is in use, the generator of
every CUDA device. Each is kept as tensors and plain values, which is all an
mvc state may hold (NumPy's state has an ndarray; Python's a tuple of 625
ints), and ``restore`` puts it back exactly.
"""

import random

import numpy as np
import torch

import mvc


def capture() -> dict:
    """The state of every global generator of this process."""
    version, internal, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state = {
        "python": {"version": version, "state": torch.tensor(internal, dtype=torch.int64), "gauss": gauss},
        "numpy": {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "gauss": float(cached)},
        "torch": torch.get_rng_state(),
        "cuda": [],
    }
    # Reading the CUDA states of a process that never used CUDA would create a
    # context on every device; such a process has drawn nothing from them.
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore(state: dict) -> None:
    """Put back what ``capture`` returned (tensors may be on any device).

    CUDA states are restored for the devices this process has; a checkpoint
    from a machine with more devices restores the ones present here.
    Raises mvc.BadInput if ``state`` is not an RNG state.
    """
    try:
        py, npy = state["python"], state["numpy"]
        python_state = (py["version"], tuple(int(v) for v in py["state"].tolist()), py["gauss"])
        numpy_state = (npy["kind"], npy["keys"].cpu().numpy().astype(np.uint32), npy["pos"],
                       npy["has_gauss"], npy["gauss"])
        torch_state = state["torch"].cpu()
        cuda_states = [s.cpu() for s in state["cuda"]]
    except (KeyError, TypeError, AttributeError) as exc:
        raise mvc.BadInput(f"the checkpoint's RNG state is damaged or from another tool ({exc!r})") from None
    random.setstate(python_state)
    np.random.set_state(numpy_state)
    torch.set_rng_state(torch_state)
    if cuda_states and torch.cuda.is_available():
        for device, cuda_state in enumerate(cuda_states[:torch.cuda.device_count()]):
            torch.cuda.set_rng_state(cuda_state, device)
