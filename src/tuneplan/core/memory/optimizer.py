"""Gradients, optimizer state, fp32 master weights and the optimizer-step temporary.

torch AdamW keeps exp_avg and exp_avg_sq like each parameter (so bf16 on pure-bf16 models);
bitsandbytes 8-bit optimizers keep uint8 states with fp32 absmax per 256 elements (tensors under
4096 elements stay 32-bit; under the HF Trainer the token embedding too:
``trainer_fp32_embedding``); transformers Adafactor keeps factored row+column second moments
and no first moment by default; SGD momentum and Lion keep one state. GaLore (galore-torch 1.0)
keeps those states at the projected (rank x max side) shape for the weights it targets, plus
one projector per targeted weight. Sharding is applied elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass

from tuneplan.core.job.galore import effective_rank
from tuneplan.core.job.methods import Trainable
from tuneplan.core.job.recipes import PrecisionPlan, Recipe
from tuneplan.core.job.strategy import Optimizer, Strategy
from tuneplan.core.job.versions import adamw_impl
from tuneplan.core.memory.assumptions import MemoryAssumptions


@dataclass(frozen=True, slots=True, kw_only=True)
class OptimizerBytes:
    grads: int
    grad_largest: int         # one tensor's gradient (optimizer in backward)
    states: int
    master: int
    step_temp: int
    formula: str
    impl: str = "fused"       # the AdamW implementation step_temp follows
    projectors: int = 0       # GaLore: the projection matrices (one per targeted weight)
    projector_formula: str = ""
    step_formula: str = ""    # GaLore: what step_temp counts


#: The planned optimizers transformers 5.24 builds as a bitsandbytes class with
#: ``optim_bits=8`` (``trainer_optimizer._get_bitsandbytes_optimizer``: ``adamw_bnb_8bit``,
#: ``paged_adamw_8bit``; GaLore's 8-bit AdamW is galore-torch's class, no override).
#: ``Trainer.create_optimizer`` then calls
#: ``bitsandbytes.optim.GlobalOptimManager.register_module_override(module, "weight",
#: {"optim_bits": 32})`` for every ``nn.Embedding`` of the model, and bitsandbytes 0.50.2
#: ``Optimizer2State.init_state`` gives such a weight two fp32 states (8 B per element).
TRAINER_FP32_EMBEDDING_OPTIMIZERS = frozenset({Optimizer.ADAMW8BIT, Optimizer.PAGED_ADAMW8BIT})
#: The recipes whose optimizer the HF Trainer builds (train.py runs hf and plain plans).
#: torchtune 0.6.1 and LitGPT 0.5.13 instantiate bitsandbytes' class themselves, with no
#: override: their embedding keeps 8-bit states.
TRAINER_RECIPES = frozenset({Recipe.HF, Recipe.PLAIN})


def trainer_fp32_embedding(strategy: Strategy, trainable: Trainable) -> int:
    """Elements of the token embedding among ``trainable.matrices`` whose 8-bit optimizer
    state is 32-bit: the HF Trainer's override (``TRAINER_FP32_EMBEDDING_OPTIMIZERS``) on a
    ``TRAINER_RECIPES`` job, not under ZeRO (DeepSpeed gives the optimizer flat fp32
    partitions, and bitsandbytes' ``check_overrides`` matches parameters by id: it finds no
    module weight). A tied head is the same Parameter: counted once. 0 otherwise."""
    if (strategy.optimizer not in TRAINER_FP32_EMBEDDING_OPTIMIZERS
            or strategy.recipe not in TRAINER_RECIPES
            or strategy.sharding.value.startswith("zero")):
        return 0
    return trainable.embedding_matrix


def _state_elements(opt: Optimizer, trainable: Trainable, width: int,
                    a: MemoryAssumptions, fp32_embedding: int = 0) -> tuple[int, str]:
    n = trainable.total
    if opt in (Optimizer.ADAMW, Optimizer.PAGED_ADAMW32BIT):
        return 2 * n * width, "2 states (exp_avg, exp_avg_sq) · trainable · state bytes"
    if opt in (Optimizer.SGD, Optimizer.LION):
        return n * width, "1 state (momentum / exp_avg) · trainable · state bytes"
    if opt is Optimizer.ADAFACTOR:
        mats = sum((r + c) * k for r, c, k in trainable.state_matrices if r > 1)
        flat = n - sum(r * c * k for r, c, k in trainable.state_matrices if r > 1)
        return (mats + flat) * 4, ("factored second moment: (rows + cols)·4 per matrix, "
                                   "4·n for vectors")
    # one tensor: under the 8-bit minimum it is among the small ones already
    big = sum(r * c * k for r, c, k in trainable.state_matrices
              if r * c >= a.optim8bit_min_size) \
        - (fp32_embedding if fp32_embedding >= a.optim8bit_min_size else 0)
    small = n - big
    per_big = 2 + 2 * 4 / a.optim8bit_blocksize
    return int(big * per_big) + small * 2 * 4, (
        "8-bit: 2 B + 2·4/256 B per element; small tensors 8 B" + (
            "; the token embedding 8 B (transformers 5.24 Trainer.create_optimizer: "
            "register_module_override(embedding, 'weight', optim_bits=32))"
            if fp32_embedding else ""))


def optimizer_bytes(strategy: Strategy, plan: PrecisionPlan, trainable: Trainable,
                    a: MemoryAssumptions,
                    galore: tuple[tuple[int, int, int], ...] = ()) -> OptimizerBytes:
    """Unsharded bytes of gradients, states, master weights and step temporary; ``galore``:
    the (rows, cols, count) weights a GaLore optimizer projects (``core.job.galore``)."""
    grads = (trainable.base_params * plan.trainable_weight_bytes
             + trainable.adapter_params * plan.adapter_bytes)
    if strategy.optimizer.is_galore:
        return _galore_bytes(strategy, plan, trainable, a, galore, grads)
    width = 4 if plan.master_bytes else plan.state_bytes
    states, formula = _state_elements(strategy.optimizer, trainable, width, a,
                                      trainer_fp32_embedding(strategy, trainable))
    master = trainable.total * plan.master_bytes
    impl = adamw_impl(strategy, a.adamw_impl)
    if (strategy.optimizer is not Optimizer.ADAMW or impl == "fused"
            or strategy.optimizer_in_backward):
        temp = 0
    elif impl == "foreach":
        temp = trainable.total * width
    elif impl == "hf":
        # transformers AdamW (optimization.py, 4.30): one tensor at a time, one temporary
        # ``denom = exp_avg_sq.sqrt().add_(eps)``
        temp = trainable.largest_tensor * width
    else:
        temp = 2 * trainable.largest_tensor * width
    largest = trainable.largest_tensor * max(plan.trainable_weight_bytes, plan.adapter_bytes)
    return OptimizerBytes(grads=grads, grad_largest=largest, states=states, master=master,
                          step_temp=temp, formula=formula, impl=impl)


#: bitsandbytes pages an optimizer state only for tensors of at least this many elements;
#: smaller ones get ordinary ``torch.zeros_like`` buffers in the allocator (bitsandbytes
#: 0.50.2 optim/optimizer.py ``Optimizer8bit.get_state_buffer``: ``p.numel() < 1e5``).
PAGED_MIN_ELEMENTS = 100_000


def paged_state_bytes(strategy: Strategy, plan: PrecisionPlan, trainable: Trainable,
                      a: MemoryAssumptions) -> int:
    """Bytes of a paged optimizer's state that live in CUDA managed memory (``get_paged``,
    cudaMallocManaged): the states of tensors of at least ``PAGED_MIN_ELEMENTS`` elements;
    0 for optimizers that do not page. Those tensors are all over the 8-bit minimum size, so
    paged-adamw8bit keeps 8-bit states for them, but for the token embedding under the HF
    Trainer (``trainer_fp32_embedding``): its two fp32 states are paged too
    (``get_state_buffer`` pages by size, whatever the dtype)."""
    if not strategy.optimizer.is_paged:
        return 0
    big = sum(r * c * k for r, c, k in trainable.state_matrices if r * c >= PAGED_MIN_ELEMENTS)
    if strategy.optimizer.is_8bit:
        fp32 = trainer_fp32_embedding(strategy, trainable)
        fp32 = fp32 if fp32 >= PAGED_MIN_ELEMENTS else 0  # smaller: not paged at all
        return int((big - fp32) * (2 + 2 * 4 / a.optim8bit_blocksize)) + fp32 * 2 * 4
    width = 4 if plan.master_bytes else plan.state_bytes
    return 2 * big * width


def _galore_bytes(strategy: Strategy, plan: PrecisionPlan, trainable: Trainable,
                  a: MemoryAssumptions, targets: tuple[tuple[int, int, int], ...],
                  grads: int) -> OptimizerBytes:
    """GaLore's optimizer state, projectors and step temporaries (galore-torch 1.0).

    ``w`` is the gradient's element width (the trainable weights' dtype: full fine-tuning, no
    master copy; sharding is refused). For a targeted (m, n) weight, r = min(rank, m, n),
    M = max(m, n), k = min(m, n):

    - states follow the projected gradient (m, r) or (r, n): AdamW ``zeros_like`` twice
      (``adamw.py``), bitsandbytes ``Optimizer2State.init_state`` at 8 bits from 4096 elements
      (``adamw8bit.py``), Adafactor's factored fp32 row + column (``adafactor.py``, beta1
      None: no first moment). Untargeted parameters get the same optimizer's plain states.
    - the projector (``galore_projector.py`` ``get_orthogonal_matrix``): on an fp32 gradient
      ``Vh[:rank, :]`` / ``U[:, :rank]`` is a view that keeps the thin SVD's whole k x k
      factor alive (k²·4 B); on a 16-bit one ``.type(original_type)`` copies r·k elements.
      Adafactor casts gradients to fp32 first (always k²·4).
    - step temporaries are one parameter's at a time (the loop steps tensors in turn), the
      largest of: the SVD refresh (every ``update_proj_gap`` steps, the first included: an
      fp32 cast of a 16-bit gradient, LAPACK's column-major copy of the input, U, S, Vh and
      ``U[:, :r] @ diag(s[:r])``, all counted alive together, LAPACK's own workspace not),
      the projected update (the projected gradient and its update temporaries at r·M, the
      projected-back m·n and its ``* scale`` copy), and an untargeted tensor's own
      temporaries (AdamW ``denom`` and ``exp_avg / denom``).
    """
    opt, w = strategy.optimizer, plan.trainable_weight_bytes
    rank = strategy.galore_rank
    n_total = trainable.total
    low = [(effective_rank(m, n, rank), max(m, n), min(m, n), m * n, k) for m, n, k in targets]
    targeted = sum(mn * k for *_, mn, k in low)
    rest = n_total - targeted
    cast = 0 if w == 4 else 1
    if opt is Optimizer.GALORE_ADAMW:
        states = 2 * (sum(r * big * k for r, big, _, _, k in low) + rest) * w
        formula = ("GaLore AdamW: 2 states · (Σ r·max(m,n) over targeted weights + untargeted "
                   "params) · grad bytes")
    elif opt is Optimizer.GALORE_ADAMW8BIT:
        per_big = 2 + 2 * 4 / a.optim8bit_blocksize
        lows = [(r * big, k) for r, big, _, _, k in low]
        big_low = sum(n * k for n, k in lows if n >= a.optim8bit_min_size)
        small_low = sum(n * k for n, k in lows if n < a.optim8bit_min_size)
        big_all = sum(r * c * k for r, c, k in trainable.matrices
                      if r * c >= a.optim8bit_min_size)
        big_rest = big_all - sum(mn * k for *_, mn, k in low if mn >= a.optim8bit_min_size)
        small_rest = rest - big_rest
        states = int((big_low + big_rest) * per_big) + (small_low + small_rest) * 2 * 4
        formula = ("GaLore 8-bit AdamW: projected (r·max(m,n)) and untargeted tensors of 4096+ "
                   "elements 2 B + 2·4/256 B each, smaller ones 8 B")
    else:
        mats = sum((r + c) * k for r, c, k in trainable.matrices if r > 1)
        flat = n_total - sum(r * c * k for r, c, k in trainable.matrices if r > 1)
        mats -= sum((m + n) * k for m, n, k in targets)
        states = (mats + flat + sum((r + big) * k for r, big, _, _, k in low)) * 4
        formula = ("GaLore Adafactor: factored fp32 rows + cols, (r + max(m,n))·4 per targeted "
                   "weight, (rows + cols)·4 per other matrix, 4·n for vectors")
    fp32_view = w == 4 or opt is Optimizer.GALORE_ADAFACTOR
    if fp32_view:
        projectors = sum(small * small * k for _, _, small, _, k in low) * 4
        pformula = "Σ min(m,n)² · 4 B: the kept view holds the thin SVD's whole fp32 factor"
    else:
        projectors = sum(r * small * k for r, _, small, _, k in low) * w
        pformula = f"Σ r·min(m,n) · {w} B: the SVD factor cast back to the gradient's dtype"
    svd = max((mn * cast + mn + small * (big + small) + small + r * r + r * big) * 4
              for r, big, small, mn, _ in low) if low else 0
    largest_rest = _largest_untargeted(trainable, targets)
    if opt is Optimizer.GALORE_ADAMW:
        update = max(((3 * r * big + 2 * mn) * w for r, big, _, mn, _ in low), default=0)
        plain = 2 * largest_rest * w
    elif opt is Optimizer.GALORE_ADAMW8BIT:
        # p.saved_data = p.data.clone(), p.grad and p.data at the projected shape
        update = max(((3 * mn + 2 * r * big) * w for r, big, _, mn, _ in low), default=0)
        plain = 0  # bitsandbytes updates in place
    else:
        update = max(((2 * cast + 2) * mn * 4 + 3 * r * big * 4 for r, big, _, mn, _ in low),
                     default=0)
        plain = (2 + 2 * cast) * largest_rest * 4
    temp = max(svd, update, plain)
    sformula = ("GaLore step, one tensor at a time: max(SVD refresh (cast + LAPACK copy + U, S, "
                "Vh + U·diag(s)) · 4 B, projected update (r·max(m,n) temporaries + m·n "
                "projected back and scaled), an untargeted tensor's temporaries)")
    largest = trainable.largest_tensor * plan.trainable_weight_bytes
    return OptimizerBytes(grads=grads, grad_largest=largest, states=states, master=0,
                          step_temp=temp, formula=formula, impl="galore", projectors=projectors,
                          projector_formula=pformula, step_formula=sformula)


def _largest_untargeted(trainable: Trainable, targets: tuple[tuple[int, int, int], ...]) -> int:
    """The largest 2-D tensor GaLore does not project (copies of a shape left untargeted)."""
    left: dict[tuple[int, int], int] = {}
    for r, c, k in trainable.matrices:
        left[(r, c)] = left.get((r, c), 0) + k
    for m, n, k in targets:
        left[(m, n)] = left.get((m, n), 0) - k
    return max((r * c for (r, c), k in left.items() if k > 0), default=0)
