"""GaLore (gradient low-rank projection) as the HF Trainer sets it up: which weights it projects.

transformers 5.24 ``trainer_optimizer.py`` ``_setup_low_rank_optimizer``: every
``nn.Linear`` whose module name matches ``optim_target_modules`` (``trainer_utils.py``
``check_target_module_exists``: for a list, a name equal to an entry, containing an entry as a
substring, or ``re.fullmatch``-ing one) has its ``.weight`` in the GaLore group (``rank``,
``update_proj_gap``, ``scale``, ``proj_type`` from ``optim_args``, defaults 128, 200, 0.25,
``std``); every other parameter (embeddings, norms, biases, the head) is a plain group of the
same optimizer class. galore-torch 1.0 then projects each targeted gradient of shape (m, n)
to (m, r) when m >= n and to (r, n) otherwise (``GaLoreProjector.project``, ``proj_type``
std), r = min(rank, m, n) as ``torch.linalg.svd(full_matrices=False)`` slices allow.

The module names follow the transformers 5 layout of llama-style decoders
(``model.layers.<i>.self_attn.<linear>``, ``model.layers.<i>.mlp.<linear>``, ``lm_head``);
other layouts are refused rather than matched against names they do not have.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import TYPE_CHECKING

from tuneplan.core.models import LinearRole, ModelSpec
from tuneplan.errors import UnsupportedError

if TYPE_CHECKING:
    from tuneplan.core.job.strategy import Strategy

#: transformers' GaLore examples (docs ``trainer.md``, "GaLore"): attention and MLP linears.
DEFAULT_TARGETS: tuple[str, ...] = (r".*.attn.*", r".*.mlp.*")
DEFAULT_RANK = 128             # transformers 5.24 _get_galore_optimizer: optim_args "rank"
DEFAULT_UPDATE_PROJ_GAP = 200  # ... "update_proj_gap"
DEFAULT_SCALE = 0.25           # ... "scale"
#: Model types whose transformers 5 modules are named as LlamaForCausalLM's (checked in their
#: modeling files: ``self.model`` with ``layers``, each with ``self_attn`` and ``mlp``).
LLAMA_LAYOUT = frozenset({"llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "phi3",
                          "olmo", "olmo2", "granite"})
_PARENT = {LinearRole.ATTENTION: "self_attn", LinearRole.MLP: "mlp"}


def target_matches(patterns: tuple[str, ...], name: str) -> bool:
    """transformers 5.24 ``check_target_module_exists`` for a list of names/patterns."""
    return (name in patterns or any(p in name for p in patterns)
            or any(re.fullmatch(p, name) for p in patterns))


def effective_rank(rows: int, cols: int, rank: int) -> int:
    """Columns the projector keeps: ``U[:, :rank]`` / ``Vh[:rank, :]`` of a thin SVD."""
    return min(rank, rows, cols)


def galore_problem(model: ModelSpec, s: Strategy) -> str | None:
    """Why GaLore cannot be estimated for ``model`` under ``s``; None when it can."""
    if model.model_type not in LLAMA_LAYOUT:
        return (f"GaLore targets are matched against module names, modelled only for "
                f"llama-style decoders ({', '.join(sorted(LLAMA_LAYOUT))}); "
                f"{model.model_type} is not one")
    odd = sorted({lin.role.value for layer in model.layers for lin in layer.linears
                  if lin.role not in _PARENT})
    if odd:
        return (f"GaLore on {model.name}: its {', '.join(odd)} linears are not nn.Linear "
                "modules under self_attn/mlp, which the estimate does not model")
    if len(model.layers) != 1:
        return "GaLore is estimated only for models with one kind of block"
    if not galore_matrices(model, s):
        return (f"no linear of {model.name} matches --galore-targets "
                f"{','.join(s.galore_targets)} (transformers raises 'No target modules found')")
    if target_matches(s.galore_targets, "lm_head"):
        return ("--galore-targets matches lm_head: GaLore on the output head is not "
                "estimated; name block linears only")
    return None


def galore_matrices(model: ModelSpec, s: Strategy) -> tuple[tuple[int, int, int], ...]:
    """(out_features, in_features, count) of the weights GaLore projects, over all blocks."""
    layer = model.layers[0]
    names = tuple((_PARENT.get(lin.role, ""), lin.name) for lin in layer.linears)
    hits = _hits(s.galore_targets, names, layer.count)
    out = []
    for lin, count in zip(layer.linears, hits, strict=True):
        if count:
            out.append((lin.out_features, lin.in_features, count * lin.copies))
    return tuple(out)


@lru_cache(maxsize=256)
def _hits(patterns: tuple[str, ...], names: tuple[tuple[str, str], ...],
          layers: int) -> tuple[int, ...]:
    """How many of the ``layers`` blocks' copies of each linear the patterns target."""
    return tuple(sum(1 for i in range(layers)
                     if parent and target_matches(patterns, f"model.layers.{i}.{parent}.{name}"))
                 for parent, name in names)


def check_patterns(patterns: tuple[str, ...]) -> None:
    """Raise UnsupportedError for a pattern ``re`` cannot compile (transformers would raise
    inside ``create_optimizer``, after the model loaded)."""
    for p in patterns:
        try:
            re.compile(p)
        except (re.error, OverflowError, RecursionError) as exc:
            raise UnsupportedError(f"--galore-targets {p!r} is not a regular expression: "
                                   f"{exc}") from None
