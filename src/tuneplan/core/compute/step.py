"""Time of one optimizer step, term by term: matmul-bound compute, per-block host overhead,
memory-bound phases (QLoRA dequantization, DoRA norms, the optimizer step) and exposed
communication. Pure; FLOPs per token come from ``core.compute.throughput``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tuneplan.core.catalog.hardware import GpuSpec
from tuneplan.core.compute.assumptions import ThroughputAssumptions
from tuneplan.core.compute.communication import (
    KNOWN_SHARDING,
    PER_MICROBATCH_GRADS,
    SHARDED_PARAMS,
    Fabric,
    collectives_per_step,
    communication_per_step,
    node_fabric,
)
from tuneplan.errors import UnsupportedError
from tuneplan.explain import Breakdown, Term

if TYPE_CHECKING:
    from tuneplan.core.compute.throughput import ComputeJob, ModelShape

#: Optimizer state bytes per trainable parameter (moments), by optimizer.
STATE_BYTES = {"adamw": 8, "paged-adamw32bit": 8, "adamw8bit": 2, "paged-adamw8bit": 2,
               "adafactor": 0, "sgd": 4, "lion": 4}


def weight_bytes(precision: str) -> int:
    """Bytes of a trainable weight as the optimizer updates it: fp32 masters unless pure bf16."""
    return 2 if precision == "bf16" else 4


def compute_dtype_bytes(precision: str) -> int:
    return 4 if precision == "fp32" else 2


def trainable_params(model: ModelShape, job: ComputeJob) -> int:
    """Parameters the optimizer updates (adapters for LoRA-like methods)."""
    from tuneplan.core.compute.throughput import adapter_params_per_token

    if job.method == "full":
        return model.total_params
    if job.method == "freeze":
        layers = min(job.trainable_layers or 1, model.num_layers)
        return model.stored_block_params * layers // model.num_layers
    head = model.vocab_size * model.hidden_size if "lm_head" in job.trainable_modules else 0
    per_token = adapter_params_per_token(model, job)
    return max(per_token, model.num_layers * model.hidden_size) + head


def _micro_batch_terms(model: ModelShape, job: ComputeJob, gpu: GpuSpec,
                       a: ThroughputAssumptions, peak: float, flops: float) -> list[Term]:
    if job.precision == "fp32":
        eff, which, size = a.fp32_matmul_efficiency, "fp32 (CUDA cores)", 1.0
    else:
        eff, which = a.matmul_efficiency(gpu.architecture)
        size = model.hidden_size / (model.hidden_size + a.hidden_size_half_efficiency)
    speed = peak * eff * size * (a.compile_speedup if job.compile else 1.0)
    if job.method == "lora8bit":
        speed /= a.int8_matmul_slowdown
    matmul_s = flops / speed
    host_s, host_inputs = _host_seconds(model, job, a)
    p = a.host_overlap_exponent
    exposed = (matmul_s**p + host_s**p) ** (1 / p) - matmul_s
    terms = [
        Term(path="micro-batch/matmul", value=matmul_s, unit="s",
             formula="FLOPs per micro-batch / (peak x efficiency x h/(h+h0))",
             inputs={"flops": flops, "peak_flops_per_s": peak, "efficiency": eff,
                     "efficiency_entry": which, "size_factor": round(size, 4)},
             source="compute-bound matmuls and attention"),
        Term(path="micro-batch/host-overhead-exposed", value=exposed, unit="s",
             formula="(matmul^p + host^p)^(1/p) - matmul", inputs={**host_inputs, "p": p},
             source="the CPU launches kernels while the GPU runs earlier ones: host time shows "
                    "only where it exceeds GPU time (small micro-batches)"),
    ]
    return terms + _memory_bound_terms(model, job, gpu, a)


def _memory_bound_terms(model: ModelShape, job: ComputeJob, gpu: GpuSpec,
                        a: ThroughputAssumptions) -> list[Term]:
    """Per micro-batch phases limited by memory links: dequantization, DoRA norms, and
    parameters streamed from the host under ``--offload optimizer+params``."""
    terms: list[Term] = []
    if job.offload == "optimizer+params":
        moved = 2 * model.total_params * compute_dtype_bytes(job.precision) / job.ranks
        terms.append(Term(
            path="micro-batch/param-offload", value=moved / a.host_link_bytes_per_s, unit="s",
            formula="2 passes x param bytes / ranks / host link",
            inputs={"bytes": moved}, source="ZeRO-Infinity/FSDP offload streams parameters "
                                            "from host memory in forward and backward"))
    bandwidth = float(gpu.memory_bandwidth_bytes_per_s or 1e12)
    if job.method in ("qlora", "lora8bit"):
        dq_passes = 3 if job.recompute else 2
        base = model.stored_block_params
        terms.append(Term(
            path="micro-batch/dequantize",
            value=dq_passes * base * a.dequant_bytes_per_param
            / (bandwidth * a.dequant_bandwidth_efficiency), unit="s",
            formula="passes x base params x bytes/param / (HBM bandwidth x efficiency)",
            inputs={"passes": dq_passes, "base_params": base, "bandwidth": bandwidth},
            source="4-bit/8-bit weights are dequantized to the compute dtype each pass"))
    if job.method == "dora":
        adapted = _adapted_weight_params(model, job)
        terms.append(Term(
            path="micro-batch/dora-norms",
            value=(3 if job.recompute else 2) * adapted * a.dora_bytes_per_adapted_param
            / bandwidth,
            unit="s", formula="passes x adapted weights x bytes / HBM bandwidth",
            inputs={"adapted_params": adapted}, source="||W + BA|| recomputed each pass"))
    return terms


def _host_seconds(model: ModelShape, job: ComputeJob,
                  a: ThroughputAssumptions) -> tuple[float, dict[str, object]]:
    """CPU time to issue one micro-batch: per block and pass, more with adapters and ZeRO-3."""
    from tuneplan.core.compute.throughput import LOW_RANK_METHODS

    passes = 4 if job.recompute else 3
    adapted = 0
    if job.method in LOW_RANK_METHODS:
        adapted = round(sum(lin.active for lin in model.adapted_linears(job.lora_targets))
                        / model.num_layers)
    hooks = a.zero3_hook_s_per_layer_pass if job.sharding in SHARDED_PARAMS else 0.0
    per_pass = a.host_overhead_s_per_layer_pass + adapted * a.host_overhead_s_per_adapter_pass
    factor = a.compiled_host_overhead_factor if job.compile else 1.0
    seconds = model.num_layers * passes * (per_pass * factor + hooks)
    return seconds, {"host_s": seconds, "layers": model.num_layers, "passes": passes,
                     "adapted_linears_per_block": adapted, "shard_hook_s": hooks}


def _adapted_weight_params(model: ModelShape, job: ComputeJob) -> int:
    return sum(lin.in_features * lin.out_features * lin.stored
               for lin in model.adapted_linears(job.lora_targets))


def _optimizer_term(model: ModelShape, job: ComputeJob, gpu: GpuSpec,
                    a: ThroughputAssumptions) -> Term:
    trainable = trainable_params(model, job)
    shards = job.ranks if job.sharding != "ddp" else 1
    per_rank = trainable / shards
    w = weight_bytes(job.precision)
    state = STATE_BYTES.get(job.optimizer, 8)
    if job.precision == "bf16" and job.optimizer in ("adamw", "sgd", "lion"):
        state //= 2  # pure bf16: torch creates the moments in the parameters' dtype
    if job.offload.startswith("optimizer"):
        seconds = per_rank / a.cpu_adam_params_per_s + per_rank * (2 + w) / a.host_link_bytes_per_s
        return Term(path="step/optimizer-offloaded", value=seconds, unit="s",
                    formula="params/rank / CPU Adam rate + (grad + weight bytes) / host link",
                    inputs={"params_per_rank": per_rank}, source="DeepSpeed CPU Adam")
    touched = 2 * w + compute_dtype_bytes(job.precision) + 2 * state
    bandwidth = float(gpu.memory_bandwidth_bytes_per_s or 1e12)
    seconds = (per_rank * touched * a.optimizer_passes
               / (bandwidth * a.optimizer_bandwidth_efficiency))
    return Term(path="step/optimizer", value=seconds, unit="s",
                formula="params/rank x (2w + g + 2 x state) bytes x passes / (HBM bw x eff)",
                inputs={"params_per_rank": per_rank, "bytes_per_param": touched,
                        "optimizer": job.optimizer}, source="memory-bound optimizer step")


def step_time(*, model: ModelShape, job: ComputeJob, gpu: GpuSpec,
              assumptions: ThroughputAssumptions, peak: float, flops_per_token: float,
              computed_tokens: int) -> tuple[Breakdown, Breakdown, float, list[str]]:
    """(step Breakdown in s, communication Breakdown in B, comm seconds, notes)."""
    a = assumptions
    if job.sharding not in KNOWN_SHARDING:
        raise UnsupportedError(f"unknown --sharding {job.sharding!r}")
    micro = _micro_batch_terms(model, job, gpu, a, peak, flops_per_token * computed_tokens)
    terms = [Term(path=t.path, value=t.value * job.grad_accum, unit="s",
                  formula=f"grad_accum x ({t.formula})",
                  inputs={**t.inputs, "grad_accum": job.grad_accum}, source=t.source)
             for t in micro]
    terms.append(_optimizer_term(model, job, gpu, a))
    comm_term, comm, comm_s, fabric = _communication(model, job, gpu, a, float(micro[0].value))
    terms.append(comm_term)
    if job.ranks > 1:
        eff = a.multi_gpu_efficiency * (a.multi_node_efficiency if job.nodes > 1 else 1.0)
        base = sum(t.value for t in terms)
        terms.append(Term(path="step/multi-gpu-sync", value=base * (1 / eff - 1), unit="s",
                          formula="step x (1/efficiency - 1)",
                          inputs={"efficiency": eff, "nodes": job.nodes},
                          source="synchronisation and stragglers beyond bytes moved"))
    notes = [] if job.ranks == 1 else [f"fabric: {fabric.intra} inside a node"
                                       + (f", {job.nodes} nodes" if job.nodes > 1 else "")]
    return Breakdown("s", tuple(terms)), comm, comm_s, notes


def _communication(model: ModelShape, job: ComputeJob, gpu: GpuSpec, a: ThroughputAssumptions,
                   micro_matmul_s: float) -> tuple[Term, Breakdown, float, Fabric]:
    """Exposed communication per step, the bytes moved, their seconds, and the fabric."""
    fabric = node_fabric(
        interconnect=gpu.interconnect, interconnect_bytes_per_s=gpu.interconnect_bytes_per_s,
        pcie_gen=gpu.pcie_gen, gpus_per_node=job.gpus, nodes=job.nodes,
        intra=job.intra_node_link, inter_node_bytes_per_s=job.inter_node_bytes_per_s,
        assumptions=a)
    dtype = compute_dtype_bytes(job.precision)
    comm = communication_per_step(
        sharding=job.sharding, ranks=job.ranks, grad_accum=job.grad_accum,
        param_bytes=model.total_params * dtype, grad_bytes=trainable_params(model, job) * dtype)
    collectives = collectives_per_step(sharding=job.sharding, ranks=job.ranks,
                                       grad_accum=job.grad_accum, num_layers=model.num_layers)
    comm_s = float(comm.total) / fabric.ring_bytes_per_s() + collectives * a.collective_latency_s
    matmul_s = micro_matmul_s * job.grad_accum
    if job.sharding in PER_MICROBATCH_GRADS:
        window, share = matmul_s, a.overlap_fraction_sharded
    else:
        window, share = micro_matmul_s * 2 / 3, a.overlap_fraction_ddp
    exposed = max(0.0, comm_s - share * window)
    term = (Term(
        path="step/communication-exposed", value=exposed, unit="s",
        formula="max(0, comm - overlap x compute window)",
        inputs={"comm_s": comm_s, "overlap": share, "window_s": window, "fabric": fabric.intra,
                "ring_bytes_per_s": fabric.ring_bytes_per_s(), "collectives": collectives},
        source="bytes / slowest ring hop + latency per collective, partly hidden by compute"))
    return term, comm, comm_s, fabric
