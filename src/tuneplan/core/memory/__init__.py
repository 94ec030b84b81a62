"""Per-GPU memory of a fine-tuning step, term by term (see ``estimate.estimate_memory``)."""

from tuneplan.core.memory.assumptions import MemoryAssumptions
from tuneplan.core.memory.estimate import MemoryEstimate, estimate_memory

__all__ = ["MemoryAssumptions", "MemoryEstimate", "estimate_memory"]
