"""Every constant the throughput estimate uses, in one object, each with the reason for its value.

Pure values only: ``ThroughputAssumptions`` is passed into ``core.compute.throughput`` and printed
with
every result (``describe``). Constants were derived from first principles or fitted to the
calibration cases in ``benchmarks/calibration`` (``benchmarks/throughput_accuracy.py``).

How a fitted constant (marked ``fitted`` below) is fitted: it minimises the median |error| of
tokens/s over the calibration rows its ``THROUGHPUT_WHY`` entry names, the other constants held,
one constant after another, repeated (``benchmarks/loso.py``). ``benchmarks/throughput_accuracy.py``
repeats that fit and scores it leave-one-source-out and leave-one-GPU-out. The reproduction does
not land on every value here: ``hidden_size_half_efficiency`` comes out near 980 rather than 450
(it trades off against the Ampere efficiency on the same rows), ``compile_speedup`` near 1.37;
benchmarks/README.md has the figures. The values here are kept until someone decides otherwise.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

#: GPU architecture word (as in gpu_specs.csv ``architecture``) -> fraction of dense peak that
#: large transformer matmuls reach in an eager PyTorch training step.
_MATMUL_EFFICIENCY: tuple[tuple[str, float], ...] = (
    ("Volta", 0.26), ("Turing", 0.30), ("Ampere", 0.61), ("Ada", 0.54), ("Hopper", 0.44),
    ("Blackwell", 0.44), ("CDNA", 0.40), ("Gaudi", 0.40),
)


@dataclass(frozen=True, slots=True, kw_only=True)
class ThroughputAssumptions:
    """Constants of the speed model; override any of them with ``dataclasses.replace``."""

    # fitted: Ampere (A100 rows), Ada (L40S rows), Volta (V100 fp16 rows); the rest derived
    matmul_efficiency_by_architecture: tuple[tuple[str, float], ...] = _MATMUL_EFFICIENCY
    matmul_efficiency_default: float = 0.45
    # fitted: Qwen one-GPU rows at seq-len >= 2048
    hidden_size_half_efficiency: int = 450
    causal_attention_factor: float = 0.5
    eager_attention_factor: float = 1.0
    # fitted: V100 BERT fp32 rows
    fp32_matmul_efficiency: float = 0.62
    # fitted: Qwen seq-len 256 rows
    host_overhead_s_per_layer_pass: float = 1.0e-3
    host_overhead_s_per_adapter_pass: float = 5.6e-5
    host_overlap_exponent: float = 2.2
    compiled_host_overhead_factor: float = 0.3
    # fitted (read off one torchtune pair): torchtune rows with torch.compile
    compile_speedup: float = 1.25
    # fitted: Qwen 1.8B full ZeRO-3 on one GPU
    zero3_hook_s_per_layer_pass: float = 1.76e-3
    padding_factor: float = 1.3
    dequant_bytes_per_param: float = 2.5
    # fitted: Qwen Q-LoRA rows
    dequant_bandwidth_efficiency: float = 0.094
    int8_matmul_slowdown: float = 1.6
    dora_bytes_per_adapted_param: float = 10.0
    optimizer_bandwidth_efficiency: float = 0.6
    optimizer_passes: float = 1.5
    nvlink_efficiency: float = 0.75
    pcie_efficiency: float = 0.6
    pcie_bytes_per_s_by_gen: tuple[tuple[int, float], ...] = (
        (3, 15.75e9), (4, 31.5e9), (5, 63.0e9), (6, 121.0e9))
    inter_node_bytes_per_s: float = 12.5e9
    inter_node_efficiency: float = 0.7
    collective_latency_s: float = 30e-6
    overlap_fraction_ddp: float = 0.8
    overlap_fraction_sharded: float = 0.5
    cpu_adam_params_per_s: float = 1.0e9
    host_link_bytes_per_s: float = 20e9
    # fitted: Qwen rows on 2-4 GPUs of one node
    multi_gpu_efficiency: float = 0.89
    # fitted: Qwen rows on 2 nodes
    multi_node_efficiency: float = 0.59
    notes: tuple[str, ...] = field(default=())

    def matmul_efficiency(self, architecture: str) -> tuple[float, str]:
        """Efficiency for a GPU architecture and which entry gave it (``default`` if none)."""
        for word, value in self.matmul_efficiency_by_architecture:
            if word.lower() in architecture.lower():
                return value, word
        return self.matmul_efficiency_default, "default"

    def pcie_bytes_per_s(self, generation: int | None) -> float:
        """One direction of a x16 link of this generation (Gen 4 when unknown)."""
        table = dict(self.pcie_bytes_per_s_by_gen)
        return table.get(generation or 4, table[4])

    def describe(self) -> dict[str, dict[str, Any]]:
        """Every constant with its value and why: what ``--json`` prints as ``assumptions``."""
        values = asdict(self)
        values.pop("notes")
        return {name: {"value": _plain(value), "why": THROUGHPUT_WHY.get(name, "")}
                for name, value in values.items()}


def _plain(value: Any) -> Any:
    if isinstance(value, tuple) and value and isinstance(value[0], tuple):
        return {str(k): v for k, v in value}
    return value


THROUGHPUT_WHY: dict[str, str] = {
    "matmul_efficiency_by_architecture": (
        "fraction of the dense tensor peak reached by a large model's matmuls in eager PyTorch; "
        "Ampere fitted to the A100 calibration cases (Qwen, torchtune), Ada to the L40S PEFT "
        "cases (power-limited card), Volta to the V100 BERT fp16 cases (small hidden size, tensor "
        "cores poorly fed); Turing set near Volta. Hopper and Blackwell "
        "have no calibration case: Ampere's 0.61 x sqrt(change in bandwidth per FLOP), since "
        "the non-matmul work scales with bandwidth (A100 -> H100 SXM: 1.64x bandwidth for "
        "3.17x FLOP/s, factor 0.72; B200 about the same); AMD and Gaudi: no data, 0.40"),
    "matmul_efficiency_default": "GPU architectures not listed above (no calibration data)",
    "hidden_size_half_efficiency": (
        "efficiency x h/(h + this): small hidden sizes give small GEMMs that reach less of the "
        "peak (fitted: Qwen 1.8B vs 7B vs 14B at long sequences)"),
    "causal_attention_factor": (
        "flash/SDPA attention skips masked blocks: QK^T and AV cost half of the full s x s work "
        "(FLOPs convention: 4*s*d_attn per token per layer forward, times this)"),
    "eager_attention_factor": "eager attention computes the full s x s scores, masked or not",
    "fp32_matmul_efficiency": (
        "fp32 runs on CUDA cores (TF32 is off by default for matmuls in PyTorch), which large "
        "GEMMs keep busy more easily than tensor cores: fitted to the V100 BERT fp32 cases"),
    "host_overhead_s_per_adapter_pass": (
        "extra launches per LoRA-adapted linear per pass (dropout, A, B, scale, add, casts)"),
    "host_overlap_exponent": (
        "GPU and host time combine as (gpu^p + host^p)^(1/p): the slower one dominates, with a "
        "soft corner where they are equal"),
    "multi_node_efficiency": (
        "per-GPU speed across nodes relative to one node, beyond bytes moved; fitted to Qwen's "
        "only multi-node rows (2 x 2 A100, about 56 % of one GPU's speed at every length)"),
    "host_overhead_s_per_layer_pass": (
        "kernel launches and Python per transformer block per pass (forward, recompute, "
        "backward counted as two) in eager mode; fitted to the Qwen seq-256 cases, where a "
        "step is launch-bound"),
    "compiled_host_overhead_factor": "torch.compile fuses kernels: fewer launches per block",
    "compile_speedup": (
        "torch.compile on the matmul-bound part (torchtune: 7075 -> 8998 tokens/s when compile "
        "was switched on, same settings otherwise)"),
    "zero3_hook_s_per_layer_pass": (
        "DeepSpeed ZeRO-3 / FSDP fetch-and-release bookkeeping per block per pass, beyond the "
        "bytes moved (fitted: Qwen 1.8B full ZeRO-3 on one GPU, which moves no bytes)"),
    "padding_factor": (
        "not fitted (it trades off against the GPU efficiency): padding to the longest "
        "sequence in a batch: tokens computed / real tokens when "
        "--no-packing and --avg-tokens are given (capped at --seq-len)"),
    "dequant_bytes_per_param": (
        "QLoRA dequantizes every base weight each pass: read 0.5 B (4-bit) + write 2 B (bf16)"),
    "dequant_bandwidth_efficiency": (
        "share of HBM bandwidth the per-layer dequantize kernels reach (small launches); fitted "
        "to Qwen QLoRA vs LoRA at equal settings: about 0.2 s extra per 8B params per micro-batch"),
    "int8_matmul_slowdown": "LLM.int8 (lora8bit) matmuls with outlier decomposition vs bf16",
    "dora_bytes_per_adapted_param": (
        "DoRA recomputes ||W + BA|| each pass: read W (2 B), write and read the fp32 sum (8 B)"),
    "optimizer_bandwidth_efficiency": (
        "share of HBM bandwidth a fused/foreach optimizer step reaches"),
    "optimizer_passes": "foreach AdamW reads and writes its tensors in more than one kernel",
    "nvlink_efficiency": (
        "NCCL bus bandwidth / one-direction NVLink bandwidth (datasheet figures are both "
        "directions, halved first)"),
    "pcie_efficiency": "NCCL bus bandwidth / one-direction PCIe x16 bandwidth (through the host)",
    "pcie_bytes_per_s_by_gen": "one direction of a x16 link by PCIe generation (PCI-SIG rates)",
    "inter_node_bytes_per_s": (
        "per node, when the provider gives no fabric: 100 Gb/s Ethernet (12.5 GB/s)"),
    "inter_node_efficiency": "NCCL bus bandwidth / link bandwidth between nodes",
    "collective_latency_s": "fixed cost of one NCCL collective (launch + ring latency)",
    "overlap_fraction_ddp": "share of backward time DDP's bucketed all-reduce hides behind",
    "overlap_fraction_sharded": "share of compute ZeRO/FSDP prefetch hides gathers behind",
    "cpu_adam_params_per_s": "DeepSpeed CPU Adam update rate per rank with optimizer offload",
    "host_link_bytes_per_s": "effective GPU<->host copy rate for offloaded states (pinned)",
    "multi_gpu_efficiency": (
        "per-GPU speed with more than one GPU relative to one GPU, beyond communication "
        "(stragglers, synchronisation); fitted to the Qwen multi-GPU cases"),
}
