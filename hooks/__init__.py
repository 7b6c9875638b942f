"""mvc_hooks: training-loop integration for mvc (imports only mvc's public API).

``Checkpointer`` commits a run's complete state (models, optimizers,
schedulers, GradScaler, RNG of every rank, data position, extra state) and
resumes it bit for bit; ``ResumableSampler`` is a shuffling sampler that
resumes mid-epoch; the policies decide when to commit. ``mvc_hooks.dcp``
holds the torch.distributed.checkpoint storage plugins (sharded saves).
"""

from .checkpointer import Checkpointer
from .policy import (Adaptive, AnyOf, EveryNSeconds, EveryNSteps, LossSummary, Observation, OnBestMetric,
                     OverheadBudget, Policy, Tracker)
from .sampler import ResumableSampler
from .state import unwrap

__all__ = ["Checkpointer", "ResumableSampler", "Policy", "EveryNSteps", "EveryNSeconds", "OnBestMetric",
           "Adaptive", "OverheadBudget", "AnyOf", "Observation", "LossSummary", "Tracker", "unwrap"]
