"""The soak: a seeded random run of commits, ref moves, merges, repacks, gcs, pushes and fetches
(a folder remote and S3), lazy clones, evictions, repairs and SIGKILLs, checked against an
oracle of every committed state bit for bit (tests/soak_driver.py says how).

CI runs a short soak. A long one: ``MVC_SOAK_OPS=5000 python -m pytest tests/test_soak.py``;
another seed: ``MVC_SOAK_SEED=N`` (``random`` for a new one each run); ``MVC_SOAK_S3=0``: the
folder remote alone (also what runs where SeaweedFS is not installed). A failure names its
seed and the command that runs it again. ``MVC_SOAK_PARANOID=1`` runs fsck of every repository and remote after every operation (slow:
to find the one that broke them); ``MVC_SOAK_TRACE=1`` prints every operation.
"""

import os
import random

import pytest

from soak_driver import Soak

DEFAULT_SEED = 39
DEFAULT_OPS = 250


def soak_seed() -> int:
    raw = os.environ.get("MVC_SOAK_SEED")
    if raw == "random":
        return random.SystemRandom().randrange(1, 10**9)
    return int(raw) if raw else DEFAULT_SEED


def s3_remote(request):
    """(url, endpoint) of a fresh prefix on the session's SeaweedFS, or None without one (the soak
    then runs with the folder remote alone) or with ``MVC_SOAK_S3=0``."""
    if os.environ.get("MVC_SOAK_S3") == "0":
        return None
    try:
        server = request.getfixturevalue("s3_server")
    except pytest.skip.Exception:
        return None
    return request.getfixturevalue("s3_url")("soak"), server.endpoint


@pytest.mark.slow  # about a minute: SeaweedFS's start, then real processes and many commits
def test_soak_every_committed_state_survives(tmp_path, request):
    seed, ops = soak_seed(), int(os.environ.get("MVC_SOAK_OPS", DEFAULT_OPS))
    trace = os.environ.get("MVC_SOAK_TRACE")
    soak = Soak(seed, ops, tmp_path, s3=s3_remote(request),
                log=print if trace else None, paranoid=os.environ.get("MVC_SOAK_PARANOID") == "1")
    print(f"soak seed {seed}, {ops} operations (MVC_SOAK_SEED={seed} MVC_SOAK_OPS={ops} to run it again)")
    counts = soak.run()
    print(f"soak seed {seed}: {counts}, {soak.kills} kills ({soak.landed_kills} before the end), "
          f"{len(soak.states)} commits")
    assert soak.kills > 0 and counts.get("push", 0) > 0 and len(soak.states) > 10
