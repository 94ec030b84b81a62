"""DeepSpeed ZeRO-1/2/3 buffers of one rank, by DeepSpeed's own size rules (deepspeed 0.19.8).

Each buffer is a named term with the line of DeepSpeed that allocates it. The phases are the
moments between calls of the training loop: after ``deepspeed.initialize`` (``init``), after the
last micro-batch's ``engine.backward`` (``backward``), after ``engine.step`` (``step``).
``tests/core/memory/test_simulation_deepspeed.py`` holds these to DeepSpeed's engine run on
simulated ranks (``adapters/probe/deepspeed_step.py``).

Rules (``runtime/zero/stage_1_and_2.py``, ``DeepSpeedZeroOptimizer.__init__``):

- ZeRO-1/2 flatten the trainable parameters of a group into one 16-bit buffer
  (``bit16_groups_flat``), every rank the whole of it: each parameter but the last padded to
  ``16 // element_size`` elements (``param_alignment``), the group to a multiple of
  ``nccl_start_alignment_factor (2) · world`` (``aligned_numel``). The model's parameters become
  views of it.
- The fp32 master partition (``single_partition_of_fp32_groups``) is ``aligned / world``
  elements (``partition_size``); AdamW's two states are as large, created at the first step.
- After backward, the gradients of the parameters that overlap this rank's partition —
  whole parameters, so more than the partition where one straddles its edge — sit in
  ``averaged_gradients`` (ZeRO-2: views of ``grads_in_partition``, whose ``total_size`` sums
  ``param_in_partition.numel()``), in the 16-bit dtype; the step frees them.
- With ``offload_optimizer`` (``self.device = 'cpu'``): master partition, its ``.grad``
  (``initialize_optimizer_states``), the 16-bit staging copy
  (``param_buffer_of_bit16_for_cpu_offload_groups``), ``temp_grad_buffer_for_cpu_offload``
  (largest parameter) and the states are host memory; ``temp_grad_buffer_for_gpu_offload``
  (largest parameter, 16-bit) stays on the accelerator. Under gradient accumulation the
  overlapping gradients accumulate on the host (``accumulated_grads_in_cpu``).

ZeRO-3 (``runtime/zero/stage3.py`` + ``partition_parameters.py``): every parameter is cut into
``ceil(numel / world)``-element partitions (``ds_tensor``; frozen ones too, under
``zero.Init``). The trainable partitions are flattened 16-bit (``fp16_partitioned_groups_flat``),
mastered in fp32 (``fp32_partitioned_groups_flat``; with offload, on the host with a pinned
``.grad``), and receive gradients in ``grad_partitions_flat_buffer``
(``_setup_for_real_optimizer``: the partitions' sum in ``gradient_accumulation_dtype``, the
16-bit dtype unless ``data_types.grad_accum_dtype`` says otherwise; ``self.device``: the host
under offload). With ``contiguous_gradients`` one ``reduce_bucket_size`` bucket of the 16-bit
dtype is allocated there too and kept for the whole run, on the accelerator (with DeepSpeed's
default 5e8 elements: 1 GB per rank). Parameters of at most
``stage3_param_persistence_threshold`` elements stay gathered after the first forward
(``persistent_parameters``).

Lines in deepspeed 0.19.8: stage_1_and_2.py 446 (``aligned_numel``), 561 (fp32 partition),
568-575 (16-bit staging), 653 / 659 (temp gradient buffers), 937 (offload ``.grad``), 2192
(``grads_in_partition``), 3266 / 3275 (the two ipg buckets); stage3.py 782 (ipg bucket), 791
(``grad_partitions_flat_buffer``), 1135-1172 (fp32 partitions); engine.py 1859 (no cast of a
zero-init model).

What is not here: the buffers alive only inside backward (ZeRO-1/2's ``reduce_bucket_size``
ipg buckets, two with ``overlap_comm``, from ``setup_buckets`` to ``_release_ipg_buffers``;
ZeRO-1's unpartitioned 16-bit gradients; ZeRO-3's gathered parameters, ``zero3_gather.py``)
and the step's fp32 gradient cast
(``steady._zero_fp32_grads``); they are transient and the CPU simulation measures buffers
between calls only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from tuneplan.core.job.methods import Method, lora_rank_of, targeted_linears
from tuneplan.core.job.strategy import Offload, Sharding, Strategy
from tuneplan.core.memory.parts import Piece, part
from tuneplan.core.models import ModelSpec

_SRC = "deepspeed 0.19.8 runtime/zero/"
#: deepspeed 0.19.8 stage_1_and_2.py ``nccl_start_alignment_factor = 2``
#: ("4-byte alignment/sizeof(fp16) = 2").
NCCL_START_ALIGNMENT = 2
#: deepspeed 0.19.8 stage_1_and_2.py ``param_alignment = 16 // gcd(16, element_size)``.
PARAM_ALIGNMENT_BYTES = 16
#: AdamW's exp_avg and exp_avg_sq, fp32, one each per master element.
ADAM_STATES = 2


@dataclass(frozen=True, slots=True, kw_only=True)
class ZeroKnobs:
    """The ``zero_optimization`` values that size buffers; defaults are DeepSpeed's own
    (deepspeed 0.19.8 ``runtime/zero/config.py``), which the emitted JSON leaves in place."""

    reduce_bucket_size: int = 500_000_000
    allgather_bucket_size: int = 500_000_000
    overlap_comm: bool = True
    contiguous_gradients: bool = True
    stage3_max_live_parameters: int = 1_000_000_000
    stage3_prefetch_bucket_size: int = 50_000_000
    stage3_param_persistence_threshold: int = 100_000
    sub_group_size: int = 1_000_000_000


@dataclass(frozen=True, slots=True, kw_only=True)
class ZeroJob:
    """One rank's view: the trainable and frozen parameters' element counts in the model's
    ``parameters()`` order, the ZeRO stage, world size, rank, offload and accumulation."""

    trainable: Sequence[int]
    frozen: Sequence[int]
    stage: int
    world: int
    rank: int = 0
    offload: bool = False
    grad_accum: int = 1
    weight_bytes: int = 2          # bf16 / fp16 model (the engine casts the module)
    #: ZeRO-3 only: bytes per element of the trainable partitions. Parameters created after
    #: ``zero.Init`` (PEFT's adapters, fp32 by its ``autocast_adapter_dtype``) keep their
    #: dtype: deepspeed 0.19.8 ``engine.py::_cast_module_mixed_precision`` casts nothing on a
    #: zero-init model. None: ``weight_bytes``.
    trainable_bytes: int | None = None
    knobs: ZeroKnobs = field(default_factory=ZeroKnobs)


@dataclass(frozen=True, slots=True)
class ZeroPhase:
    device: list[Piece]
    host: list[Piece]


def _aligned(numels: Sequence[int], world: int, elem: int) -> int:
    align = PARAM_ALIGNMENT_BYTES // _gcd(PARAM_ALIGNMENT_BYTES, elem)
    padded = sum(n + (-n) % align for n in numels[:-1]) + (numels[-1] if numels else 0)
    unit = NCCL_START_ALIGNMENT * world
    return -(-padded // unit) * unit


def _gcd(a: int, b: int) -> int:
    while b:
        a, b = b, a % b
    return a


def _overlapping(numels: Sequence[int], world: int, rank: int, elem: int) -> int:
    """Elements of the whole parameters that overlap ``rank``'s partition of the flat buffer
    (``get_partition_info``; padding between parameters counted in their offsets)."""
    align = PARAM_ALIGNMENT_BYTES // _gcd(PARAM_ALIGNMENT_BYTES, elem)
    size = _aligned(numels, world, elem) // world
    lo, hi = rank * size, (rank + 1) * size
    total = offset = 0
    for i, n in enumerate(numels):
        if offset < hi and offset + n > lo:
            total += n
        offset += n + (0 if i == len(numels) - 1 else (-n) % align)
    return total


def zero_phases(job: ZeroJob) -> dict[str, ZeroPhase]:
    """Per phase (``init``, ``backward``, ``step``): the rank's buffers on the accelerator and
    on the host."""
    return _stage3(job) if job.stage == 3 else _stage12(job)


def _stage12(job: ZeroJob) -> dict[str, ZeroPhase]:
    w, e = job.world, job.weight_bytes
    aligned = _aligned(job.trainable, w, e)
    partition = aligned // w
    largest = max(job.trainable, default=0)
    src = _SRC + "stage_1_and_2.py DeepSpeedZeroOptimizer"
    flat = part("zero/bit16_flat", aligned * e,
                f"trainable params flattened, padded to {PARAM_ALIGNMENT_BYTES} B each and "
                f"to 2·world elements: {aligned} · {e} B (every rank)", src + " bit16_groups_flat")
    device = [flat]
    if job.frozen:
        device.append(part("zero/frozen_weights", sum(job.frozen) * e,
                           "frozen params, whole on every rank · 16-bit",
                           "deepspeed engine.py _cast_module_mixed_precision"))
    master = part("zero/fp32_master_partition", partition * 4,
                  f"aligned / {w} ranks · 4 B", src + " single_partition_of_fp32_groups")
    states = part("zero/optimizer_states", ADAM_STATES * partition * 4,
                  f"AdamW exp_avg + exp_avg_sq of the partition: 2 · {partition} · 4 B",
                  "torch AdamW / DeepSpeedCPUAdam state")
    overlap = _overlapping(job.trainable, w, job.rank, e)
    grads = part("zero/partition_grads", overlap * e,
                 f"16-bit grads of the whole params overlapping rank {job.rank}'s partition: "
                 f"{overlap} · {e} B", src + " averaged_gradients / grads_in_partition")
    host: list[Piece] = []
    if job.offload:
        host = [master,
                part("zero/fp32_master_grad", partition * 4, "partition · 4 B (pinned)",
                     src + " initialize_optimizer_states"),
                part("zero/bit16_staging", partition * e, f"partition · {e} B (pinned)",
                     src + " param_buffer_of_bit16_for_cpu_offload_groups"),
                part("zero/temp_grad_cpu", largest * e, f"largest param · {e} B (pinned)",
                     src + " temp_grad_buffer_for_cpu_offload")]
        device.append(part("zero/temp_grad_gpu", largest * e, f"largest param · {e} B",
                           src + " temp_grad_buffer_for_gpu_offload"))
        accum = [part("zero/accumulated_grads_cpu", overlap * e,
                      f"overlapping grads accumulated on the host · {e} B",
                      src + " accumulated_grads_in_cpu")] if job.grad_accum > 1 else []
        return {"init": ZeroPhase(device, host),
                "backward": ZeroPhase(device, host + accum),
                "step": ZeroPhase(device, host + accum + [states])}
    return {"init": ZeroPhase([*device, master], host),
            "backward": ZeroPhase([*device, master, grads], host),
            "step": ZeroPhase([*device, master, states], host)}


def _stage3(job: ZeroJob) -> dict[str, ZeroPhase]:
    w, e = job.world, job.weight_bytes
    src = _SRC + "stage3.py DeepSpeedZeroOptimizer_Stage3"
    partition = sum(-(-n // w) for n in job.trainable)
    frozen = sum(-(-n // w) for n in job.frozen)
    threshold = job.knobs.stage3_param_persistence_threshold
    persistent = sum(n for n in (*job.trainable, *job.frozen) if n <= threshold)
    te = job.trainable_bytes or e
    fp16 = part("zero/fp16_partitions", partition * te,
                f"sum of ceil(numel / {w}) over trainable params · {te} B",
                src + " fp16_partitioned_groups_flat")
    device = [fp16]
    if job.knobs.contiguous_gradients:
        device.append(part("zero/ipg_bucket", job.knobs.reduce_bucket_size * e,
                           f"one reduce bucket of reduce_bucket_size "
                           f"{job.knobs.reduce_bucket_size} elements · {e} B, kept all run",
                           src + " _setup_for_real_optimizer (ipg_buckets buffer)"))
    if job.frozen:
        device.append(part("zero/frozen_partitions", frozen * e,
                           f"sum of ceil(numel / {w}) over frozen params · {e} B",
                           _SRC + "partition_parameters.py ds_tensor"))
    master = part("zero/fp32_master_partition", partition * 4, "partition · 4 B",
                  src + " fp32_partitioned_groups_flat")
    grads = part("zero/grad_partitions", partition * e,
                 f"partition · {e} B (gradient_accumulation_dtype)",
                 src + " grad_partitions_flat_buffer")
    states = part("zero/optimizer_states", ADAM_STATES * partition * 4,
                  "AdamW exp_avg + exp_avg_sq: 2 · partition · 4 B",
                  "torch AdamW / DeepSpeedCPUAdam state")
    kept = [part("zero/persistent_params", persistent * e,
                 f"params of ≤ {threshold} elements kept gathered after forward · {e} B",
                 _SRC + "partitioned_param_coordinator.py persistent_parameters")]
    if job.offload:
        host = [master, part("zero/fp32_master_grad", partition * 4, "partition · 4 B (pinned)",
                             src + " _create_fp32_partitions"), grads]
        return {"init": ZeroPhase(device, host),
                "backward": ZeroPhase(device + kept, host),
                "step": ZeroPhase(device + kept, [*host, states])}
    on = [*device, master, grads]
    return {"init": ZeroPhase(on, []), "backward": ZeroPhase(on + kept, []),
            "step": ZeroPhase(on + kept + [states], [])}


_STAGES = {Sharding.ZERO1: 1, Sharding.ZERO2: 2, Sharding.ZERO3: 3}


def param_numels(model: ModelSpec, s: Strategy) -> tuple[list[int], list[int]]:
    """(trainable, frozen) element counts in ``model.parameters()`` order of a transformers
    decoder (embedding; per block its linears in ``ModelSpec`` order, then its norms; final
    norm; untied head), LoRA's A then B after each targeted linear (PEFT ``LoraLayer``).
    A block's norms are taken as one tensor (their split does not move a partition edge by
    more than a norm's size)."""
    full = s.method is Method.FULL
    if not full and not s.method.is_lora:
        raise ValueError(f"ZeRO buffers are modelled for full and LoRA jobs, not {s.method}")
    trainable: list[int] = []
    frozen: list[int] = []
    put = trainable if full else frozen
    put.append(model.embedding_params)
    for layer in model.layers:
        targets = {id(t) for t in targeted_linears(model, s, layer)} if not full else set()
        for _ in range(layer.count):
            for lin in layer.linears:
                put.extend([lin.in_features * lin.out_features] * lin.copies)
                if lin.bias:
                    put.extend([lin.out_features] * lin.copies)
                if id(lin) in targets:
                    r = lora_rank_of(lin, s)
                    trainable.extend([r * lin.in_features, lin.out_features * r] * lin.copies)
            if layer.norm_params:
                put.append(layer.norm_params)
    if model.final_norm_params:
        put.append(model.final_norm_params)
    if not model.tie_word_embeddings:
        put.append(model.vocab_size * (model.head_in_features or model.hidden_size))
    return trainable, frozen


def zero_job(model: ModelSpec, s: Strategy, rank: int = 0,
             knobs: ZeroKnobs | None = None) -> ZeroJob:
    """The ZeroJob of ``s`` (``--sharding zero1|zero2|zero3``) on ``model`` for one rank."""
    stage = _STAGES.get(s.sharding)
    if stage is None:
        raise ValueError(f"--sharding {s.sharding} is not DeepSpeed ZeRO")
    trainable, frozen = param_numels(model, s)
    late = 4 if stage == 3 and s.method.is_lora else None   # fp32 adapters, see trainable_bytes
    return ZeroJob(trainable=trainable, frozen=frozen, stage=stage, world=s.world_size,
                   rank=rank, offload=s.offload is not Offload.NONE, grad_accum=s.grad_accum,
                   weight_bytes=s.precision.compute_bytes, trainable_bytes=late,
                   knobs=knobs or ZeroKnobs())


#: The offloaded buffers the estimator's host RAM lacks beside the fp32 master and the
#: optimizer states (those are ``steady.static_terms``' own terms).
_HOST_EXTRAS = ("zero/fp32_master_grad", "zero/bit16_staging", "zero/temp_grad_cpu",
                "zero/grad_partitions", "zero/accumulated_grads_cpu")


def offload_host_extras(model: ModelSpec, s: Strategy) -> list[Piece]:
    """Host buffers of ZeRO's optimizer offload per rank beyond master weights and states:
    the pinned fp32 gradient partition, ZeRO-1/2's 16-bit staging copy and gradient buffer,
    ZeRO-3's gradient partitions (``self.device`` is the host), accumulated gradients. Empty
    when the job is not a ZeRO offload of a full or LoRA job."""
    if s.sharding not in _STAGES or s.offload is Offload.NONE or not (
            s.method is Method.FULL or s.method.is_lora):
        return []
    step = zero_phases(zero_job(model, s))["step"]
    return [part("host/" + p.path.removeprefix("zero/"), int(p.value), p.formula, p.source)
            for p in step.host if p.path in _HOST_EXTRAS]
