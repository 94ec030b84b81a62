"""One micro-batch's shapes as the per-framework layouts (``litgpt.py``, ``torchtune.py``,
``unsloth.py``) read them: tokens, batch, sequence, widths, counts and the compute dtype's
bytes, from the model and the strategy. Each layout adds its own switches."""

from __future__ import annotations

from dataclasses import dataclass

from tuneplan.core.job.strategy import Strategy
from tuneplan.core.models import ModelSpec


@dataclass(frozen=True, slots=True, kw_only=True)
class BlockDims:
    t: int          # tokens B·S
    b: int          # micro-batch
    s: int          # sequence length
    h: int          # hidden size
    qd: int         # query width: heads · head_dim
    kvd: int        # key/value width: kv heads · head_dim
    inter: int      # MLP width
    vocab: int
    heads: int
    layers: int
    c: int          # compute bytes


def block_dims(model: ModelSpec, s: Strategy) -> dict[str, int]:
    """``BlockDims``' fields for ``model`` under ``s`` (keyword arguments, so a layout's own
    subclass adds its switches beside them)."""
    return {"t": s.batch_size * s.seq_len, "b": s.batch_size, "s": s.seq_len,
            "h": model.hidden_size, "qd": model.num_heads * model.head_dim,
            "kvd": model.num_kv_heads * model.head_dim, "inter": model.intermediate_size,
            "vocab": model.vocab_size, "heads": model.num_heads, "layers": model.num_layers,
            "c": s.precision.compute_bytes}
