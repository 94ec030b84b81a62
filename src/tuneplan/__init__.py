"""tuneplan: will a fine-tuning job fit, where, how fast, at what cost, and how to launch it.

The curated public API lives here; ``tests/test_public_api.py`` keeps it in check. Names are
imported on first use (PEP 562), so ``import tuneplan`` (and every ``tuneplan.*`` submodule,
the CLI's included) does not pay for the planner, the hub or the store until they are asked for.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tuneplan.adapters.hub import resolve_model
    from tuneplan.adapters.plans import plan
    from tuneplan.adapters.store import load_catalog
    from tuneplan.core.compute.throughput import estimate_throughput
    from tuneplan.core.job.strategy import Job, Strategy
    from tuneplan.core.memory import MemoryAssumptions, MemoryEstimate, estimate_memory
    from tuneplan.core.models import (
        ModelSpec,
        ParameterCounts,
        count_parameters,
        parse_model_config,
    )
    from tuneplan.core.planner.plan import PlanResult
    from tuneplan.errors import TuneplanError
    from tuneplan.explain import Breakdown, Term

__version__ = "0.1.0"

# public name -> module that defines it
_LAZY = {
    "resolve_model": "tuneplan.adapters.hub",
    "plan": "tuneplan.adapters.plans",
    "load_catalog": "tuneplan.adapters.store",
    "estimate_throughput": "tuneplan.core.compute.throughput",
    "Job": "tuneplan.core.job.strategy",
    "Strategy": "tuneplan.core.job.strategy",
    "MemoryAssumptions": "tuneplan.core.memory",
    "MemoryEstimate": "tuneplan.core.memory",
    "estimate_memory": "tuneplan.core.memory",
    "ModelSpec": "tuneplan.core.models",
    "ParameterCounts": "tuneplan.core.models",
    "count_parameters": "tuneplan.core.models",
    "parse_model_config": "tuneplan.core.models",
    "PlanResult": "tuneplan.core.planner.plan",
    "TuneplanError": "tuneplan.errors",
    "Breakdown": "tuneplan.explain",
    "Term": "tuneplan.explain",
}

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


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'tuneplan' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value  # later lookups skip this hook
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
