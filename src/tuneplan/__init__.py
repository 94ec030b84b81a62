"""tuneplan: will a fine-tuning job fit, where, how fast, at what cost, and how to launch it.

The curated public API lives here; ``tests/test_public_api.py`` keeps it in check.
"""

from __future__ import annotations

from tuneplan.adapters.hub import resolve_model
from tuneplan.adapters.plans import plan
from tuneplan.adapters.store import load_catalog
from tuneplan.core.compute.throughput import estimate_throughput
from tuneplan.core.job.strategy import Job, Strategy
from tuneplan.core.memory import MemoryAssumptions, MemoryEstimate, estimate_memory
from tuneplan.core.models import ModelSpec, ParameterCounts, count_parameters, parse_model_config
from tuneplan.core.planner.plan import PlanResult
from tuneplan.errors import TuneplanError
from tuneplan.explain import Breakdown, Term

__version__ = "0.1.0"

__all__ = [
    "Breakdown",
    "Job",
    "MemoryAssumptions",
    "MemoryEstimate",
    "ModelSpec",
    "ParameterCounts",
    "PlanResult",
    "Strategy",
    "Term",
    "TuneplanError",
    "__version__",
    "count_parameters",
    "estimate_memory",
    "estimate_throughput",
    "load_catalog",
    "parse_model_config",
    "plan",
    "resolve_model",
]
