"""How a rank process of a real gloo job ends, shared by the distributed tests.

torch's gloo teardown is not safe to leave to the interpreter: a rank whose
DistributedDataParallel (its Reducer) is freed while a gloo worker thread
still releases the last collective deadlocks (the freeing thread holds the
GIL and joins the worker; the worker waits for the GIL), and at interpreter
finalization a rank can abort ("terminate called without an active
exception"). Both were seen here on ranks that had passed every assertion.
So a rank ends while its objects are still alive: destroy the process
group, then ``os._exit`` with 0 if the block passed and 1 (traceback
printed) if it raised.
"""

import os
import sys
import traceback
from contextlib import contextmanager

import torch.distributed as dist


@contextmanager
def rank_process():
    """Run the block, then end this process (0: passed; 1: raised) without freeing anything."""
    code = 0
    try:
        yield
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
