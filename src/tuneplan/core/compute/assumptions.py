"""Every constant the throughput estimate uses, in one object, each with the reason for its value.

Pure values only: ``ThroughputAssumptions`` is passed into ``core.compute.throughput`` and printed
with
every result (``describe``). Constants were derived from first principles or fitted to the
calibration cases in ``benchmarks/calibration`` (``benchmarks/throughput_accuracy.py``).

How a fitted constant (marked ``fitted`` below) is fitted: it minimises the median |error| of
tokens/s over the calibration rows its ``THROUGHPUT_WHY`` entry names, the other constants held,
one constant after another, repeated (``benchmarks/loso.py``). ``benchmarks/throughput_accuracy.py``
repeats that fit and scores it leave-one-source-out and leave-one-GPU-out. The values here are
that fit on all rows (benchmarks/README.md has the figures), made after the attention kernel,
eager attention's score traffic and the loss over the logits got terms of their own: the
fitted share no longer absorbs their time.

The elementwise ops between the GEMMs (norms, rotary, activation, residual adds, dropout,
mixed-precision casts: ``core.compute.elementwise``) are timed from bandwidth and shown in
every breakdown, but counted at ``elementwise_exposed_share`` = 0: the fitted shares still
carry them. Counting them in full (share 1) and refitting the constants above to the
procedure's fixed point (refitting from them returns them: matmul_step_share 0.8264,
pre_ampere_step_factor 0.775, fp32_matmul_efficiency 0.6643, hidden_size_half_efficiency
891, host_overhead_s_per_layer_pass 6.305e-4, zero3_hook_s_per_layer_pass 2.017e-3,
dequant_bandwidth_efficiency 0.0931, multi_node_efficiency 0.4672, compile_speedup 1.523)
scored worse on benchmarks/throughput_accuracy.py (91 rows, median |error|): in-sample
4.2 -> 5.3 %, leave-one-source-out 4.9 -> 6.8 %, leave-one-GPU-out 7.9 -> 10.8 %, and the
L40S rows, the only bandwidth-poor GPU of the set (3.2 B of DRAM bandwidth per kFLOP of
measured matmul rate, the A100 7.5), 6.6 -> 13.6 % (predicted too slow: the terms are
10-30 % of their step even with L2-resident intermediates); fitting the share with the step
share was degenerate (0.76, leave-one-GPU-out 16.6 %). So the calibration set does not
support more time on bandwidth-poor cards than the fitted shares give them; the terms say
what the bytes are, with low confidence, until rows on such cards (L4, RTX 4090/6000 Ada,
H100 vs H200) test them.

The matmul-bound time is per GPU, from physics rather than per architecture: each card's
matmul ceiling is a published measurement of the dense matmul rate it sustains
(``MEASURED_MATMUL_TFLOPS``) or a measured sibling's fraction moved by the power rule
(``core.compute.ceiling``), and one fitted ``matmul_step_share`` says how much of that ceiling
a training step's matmuls reach on every GPU.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

_MAMF = ("stas00/ml-engineering, compute/accelerator/README.md, 'Maximum Achievable Matmul "
         "FLOPS comparison table' (BF16, mean of 100 iterations)")
_TPT = ("zzc0721/torch-performance-test-data (GitHub), its {card} submission ({torch}): best "
        "torch.matmul of 1024..10240 squared, {dtype}")

#: Measured dense matmul rate per GPU: (name as gpu_specs.csv has it, architecture word, die,
#: measured TFLOP/s with BF16 inputs (FP16 on cards without BF16), the card's dense peak and
#: board power from gpu_specs.csv (the conditions of the measurement), source). A card missing
#: here takes a measured sibling's fraction moved by the power rule
#: (``sustained_clock_power_exponent``; ``core.compute.ceiling``).
MeasuredMatmul = tuple[str, str, str, float, float, float, str]
MEASURED_MATMUL_TFLOPS: tuple[MeasuredMatmul, ...] = (
    ("A100 80GB SXM4", "Ampere", "GA100", 271.2, 312, 400,
     _MAMF + ": A100 SXM 271.2 of 312, torch 2.6.0+cu126"),
    ("A100 40GB SXM4", "Ampere", "GA100", 271.2, 312, 400,
     _MAMF + ": A100 SXM 271.2 of 312 (same die and clocks as the 80GB)"),
    ("A100 80GB PCIe", "Ampere", "GA100", 252.9, 312, 300,
     _MAMF + ": A100 PCIe 252.9 of 312, torch 2.5.1+cu124"),
    ("A100 40GB PCIe", "Ampere", "GA100", 252.9, 312, 250,
     _MAMF + ": A100 PCIe 252.9 of 312"),
    ("H100 SXM5", "Hopper", "GH100", 794.5, 989.5, 700,
     _MAMF + ": H100 SXM 794.5 of 989, torch 2.7.0+cu126"),
    ("H200 SXM", "Hopper", "GH100", 794.5, 989.5, 700,
     _MAMF + ": 'H200 is the same' as its H100 SXM row"),
    ("GH200 (96GB HBM3)", "Hopper", "", 828.6, 989.5, 1000,
     _MAMF + ": GH200 SXM 828.6 of 989, the 900 W 141 GiB HBM3e version (the same GH100 "
             "die; the module's power includes the Grace CPU, so the power rule does not "
             "apply)"),
    ("B200 (HGX)", "Blackwell", "GB100 dual-die", 1745.0, 2250, 1000,
     _MAMF + ": B200 SXM 1745.0 of 2250, torch 2.7.1+cu128"),
    ("B300 (HGX)", "Blackwell", "dual-die", 1769.0, 2250, 1100,
     _MAMF + ": B300 SXM 1769.0 of 2250, torch 2.9.1+cu130"),
    ("GB200 (per Blackwell GPU)", "Blackwell", "NVL72 rack", 1822.0, 2500, 1200,
     _MAMF + ": GB200 SXM 1822.0 of 2500"),
    ("MI300X", "CDNA", "", 668.4, 1307.4, 750,
     _MAMF + ": MI300X 668.4 of 1300, PYTORCH_TUNABLEOP_ENABLED=1"),
    ("MI325X", "CDNA", "", 784.9, 1307.4, 1000, _MAMF + ": MI325X 784.9 of 1300, 1000 W"),
    ("MI355X", "CDNA", "", 1565.0, 2516.6, 1400,
     _MAMF + ": MI355X 1565.0 (of its 2300 there; gpu_specs_extra.csv gives 2516.6)"),
    ("Gaudi 2", "Gaudi", "", 418.7, 432, 600, _MAMF + ": Gaudi 2 418.7, PT_HPU_LAZY_MODE=1"),
    ("Gaudi 3", "Gaudi", "2 dies", 1243.0, 1835, 900, _MAMF + ": Gaudi 3 1243.0"),
    ("L40S", "Ada", "AD102", 269.15, 362, 350,
     _TPT.format(card="NVIDIA L40S", torch="torch 2.8.0+cu128",
                 dtype="BF16 269.15 of 362 (350 W: the clock falls under sustained load; "
                       "columns FP32, FP16, BF16)")),
    ("RTX 4090", "Ada", "AD102", 164.81, 165.2, 450,
     _TPT.format(card="RTX 4090", torch="torch 2.7.0+cu128",
                 dtype="BF16 164.81 of its 165.2 FP32-accumulate rate (half rate: the 450 W "
                       "limit does not bind)")),
    ("RTX 5090", "Blackwell", "GB202", 240.05, 209.5, 575,
     _TPT.format(card="RTX 5090", torch="torch 2.7.0+cu128",
                 dtype="BF16 240.05, above the 209.5 FP32-accumulate half rate gpu_specs.csv "
                       "assumes for it")),
    ("RTX 3090", "Ampere", "GA102", 76.58, 71, 350,
     _TPT.format(card="RTX 3090", torch="torch 2.5.1+cu124",
                 dtype="BF16 76.58, above its rated 71 FP32-accumulate rate (GeForce boost "
                       "clocks run past the rated one where power allows; columns FP32, "
                       "FP16, BF16)")),
    ("RTX A6000", "Ampere", "GA102", 123.34, 154.8, 300,
     _TPT.format(card="NVIDIA RTX A6000", torch="torch 2.8.0+cu128",
                 dtype="BF16 123.34 of 154.8 (columns FP32, FP16, BF16)")),
    ("A40", "Ampere", "GA102", 122.29, 149.7, 300,
     _TPT.format(card="NVIDIA A40", torch="torch 2.11.0+cu128", dtype="BF16 122.29 of 149.7")),
    ("L4", "Ada", "AD104", 70.89, 121, 72,
     _TPT.format(card="NVIDIA L4", torch="torch 2.9.0+cu128", dtype="BF16 70.89 of 121 (72 W)")),
    ("V100 SXM2 16GB", "Volta", "GV100", 97.36, 125, 300,
     _TPT.format(card="Tesla V100-SXM2-16GB", torch="torch 2.7.0+cu128",
                 dtype="FP16 97.36 of 125 (no BF16)")),
)


_WP = "NVIDIA {arch} architecture whitepaper: {die} {mb} MB L2"
#: L2 cache per GPU (bytes, source): the elementwise ops' intermediates stay there when the
#: tensors fit (core.compute.step.elementwise_terms). A GPU missing here gets no L2 credit.
L2_CACHE_BYTES: tuple[tuple[str, int, str], ...] = (
    *((n, 40 * 10**6, _WP.format(arch="A100 Tensor Core GPU", die="GA100", mb=40))
      for n in ("A100 40GB PCIe", "A100 40GB SXM4", "A100 80GB PCIe", "A100 80GB SXM4")),
    *((n, 50 * 10**6, _WP.format(arch="H100 Tensor Core GPU", die="GH100 (H100)", mb=50))
      for n in ("H100 PCIe", "H100 SXM5", "H100 NVL", "H200 SXM", "H200 NVL")),
    *((n, 96 * 10**6, _WP.format(arch="Ada GPU", die="AD102 (L40/L40S/RTX 6000 Ada)", mb=96))
      for n in ("L40", "L40S", "RTX 6000 Ada")),
    ("RTX 4090", 72 * 10**6, _WP.format(arch="Ada GPU", die="RTX 4090 (cut AD102)", mb=72)),
    ("L4", 48 * 10**6, _WP.format(arch="Ada GPU", die="AD104", mb=48)),
    *((n, 6 * 10**6, _WP.format(arch="Ampere GA102 GPU", die="GA102", mb=6))
      for n in ("A10", "A10G", "A40", "RTX A6000", "RTX 3090")),
    *((n, 6 * 10**6, _WP.format(arch="Tesla V100 GPU", die="GV100", mb=6))
      for n in ("V100 SXM2 16GB", "V100 SXM2 32GB", "V100 PCIe 16GB", "V100 PCIe 32GB")),
    ("T4", 4 * 10**6, _WP.format(arch="Turing GPU", die="TU104", mb=4)),
)


@dataclass(frozen=True, slots=True, kw_only=True)
class ThroughputAssumptions:
    """Constants of the speed model; override any of them with ``dataclasses.replace``."""

    # per GPU: the measured matmul rate (MEASURED_MATMUL_TFLOPS) or a sibling's moved by the
    # power rule, times the share of it an eager training step's matmuls reach
    measured_matmul_tflops: tuple[MeasuredMatmul, ...] = MEASURED_MATMUL_TFLOPS
    sustained_clock_power_exponent: float = 1 / 3
    matmul_fraction_default: float = 0.80
    # fitted: mixed-precision rows on A100 and L40S (one share for every GPU); refitted with
    # the attention, eager-score and loss terms priced on their own (0.71 before them); it
    # still carries the elementwise ops (elementwise_exposed_share = 0; 0.8264 with them)
    matmul_step_share: float = 0.757
    # fitted: V100 fp16 rows (BERT); applies to Volta and Turing (0.68 before eager
    # attention's score traffic was timed from bandwidth: that traffic was most of the gap)
    pre_ampere_step_factor: float = 0.90
    # overrides by architecture word; empty by default
    matmul_efficiency_by_architecture: tuple[tuple[str, float], ...] = ()
    # overrides per GPU: (gpu_specs name, fraction of the dense peak, source); a probe's
    # calibration prepends one for the GPU it ran on; empty by default
    matmul_efficiency_by_gpu: tuple[tuple[str, float, str], ...] = ()
    # the same per GPU and job class (core.compute.step.job_class: full or adapter training,
    # and the precision): (gpu_specs name, job class, fraction, source), consulted first
    matmul_efficiency_by_gpu_job: tuple[tuple[str, str, float, str], ...] = ()
    # the model's error (predicted - measured) / measured, 10th and 90th percentile over the
    # calibration set (benchmarks/throughput_accuracy.py prints both): assumed = held out
    # (leave-one-GPU-out), calibrated = in-sample (constants fitted with the GPU's own rows)
    assumed_error_range: tuple[float, float] = (-0.093, 0.184)
    calibrated_error_range: tuple[float, float] = (-0.099, 0.136)
    # fitted: Qwen one-GPU rows at seq-len >= 2048
    hidden_size_half_efficiency: int = 1148
    causal_attention_factor: float = 0.5
    eager_attention_factor: float = 1.0
    # FlashAttention-2's share of each GPU's matmul ceiling, by architecture word (derived)
    flash_attention_ceiling_share: tuple[tuple[str, float], ...] = (
        ("Hopper", 0.44), ("Blackwell", 0.44), ("default", 0.71))
    # memory-bound kernels: share of the datasheet bandwidth they reach (assumed), and the
    # bytes each moves (derived from the kernels' code; see THROUGHPUT_WHY)
    elementwise_bandwidth_efficiency: float = 0.7
    # the elementwise ops' terms (core.compute.elementwise) count this share of their time
    elementwise_exposed_share: float = 0.0
    # the adapters' own elementwise ops (casts, dropout, scale and add around each frozen
    # GEMM; core.compute.elementwise): the share of their bandwidth time counted; None: the
    # generic elementwise_exposed_share. 1 was scored and not adopted (see THROUGHPUT_WHY)
    adapter_exposed_share: float | None = None
    # L2 per GPU, the share of it an op's live tensors may fill and stay there, and the L2's
    # rate as a multiple of the DRAM one (assumed)
    l2_cache_bytes: tuple[tuple[str, int, str], ...] = L2_CACHE_BYTES
    l2_resident_share: float = 0.5
    l2_bandwidth_ratio: float = 3.0
    eager_score_bytes_forward: float = 24.0
    eager_score_bytes_backward: float = 28.0
    standard_loss_bytes_per_logit: float = 48.0
    fused_loss_bytes_per_logit: float = 6.0
    compiled_loss_bytes_per_logit: float = 8.0
    # fitted: V100 BERT fp32 rows
    fp32_matmul_efficiency: float = 0.678
    # fitted: Qwen seq-len 256 rows
    host_overhead_s_per_layer_pass: float = 7.75e-4
    host_overhead_s_per_adapter_pass: float = 5.6e-5
    host_overlap_exponent: float = 2.2
    compiled_host_overhead_factor: float = 0.3
    # fitted: torchtune rows with torch.compile (1.25 when read off one pair)
    compile_speedup: float = 1.461
    # fitted: Qwen 1.8B full ZeRO-3 on one GPU
    zero3_hook_s_per_layer_pass: float = 1.877e-3
    padding_factor: float = 1.3
    dequant_bytes_per_param: float = 2.5
    # fitted: Qwen Q-LoRA rows (GPTQ int4 checkpoints through auto-gptq)
    dequant_bandwidth_efficiency: float = 0.0982
    # bitsandbytes NF4/FP4: a streaming dequantize kernel per linear and pass (derived)
    nf4_dequant_bandwidth_efficiency: float = 0.6
    int8_matmul_slowdown: float = 1.6
    dora_bytes_per_adapted_param: float = 10.0
    optimizer_bandwidth_efficiency: float = 0.6
    # SGD, Adafactor, bitsandbytes 8-bit: passes over their tensors per step (assumed)
    optimizer_passes: float = 1.5
    # AdamW: element passes per step relative to one read of p, g, m, v and one write of p, m,
    # v (7): derived from the kernels' code (see THROUGHPUT_WHY), per implementation
    adamw_fused_passes: float = 1.0
    adamw_unfused_passes: float = 20 / 7
    nvlink_efficiency: float = 0.75
    pcie_efficiency: float = 0.6
    pcie_bytes_per_s_by_gen: tuple[tuple[int, float], ...] = (
        (3, 15.75e9), (4, 31.5e9), (5, 63.0e9), (6, 121.0e9))
    inter_node_bytes_per_s: float = 12.5e9
    inter_node_efficiency: float = 0.7
    # NCCL's latency model of a ring collective (Simple protocol), src/graph/tuning.cc
    nccl_base_latency_s: float = 8.4e-6
    nccl_hop_latency_s: tuple[tuple[str, float], ...] = (
        ("nvlink", 3.4e-6), ("pcie", 5.7e-6), ("net", 14.0e-6))
    overlap_fraction_ddp: float = 0.8
    overlap_fraction_sharded: float = 0.5
    cpu_adam_params_per_s: float = 1.0e9
    cpu_adam_params_per_s_per_core: float = 6.0e7
    host_link_bytes_per_s: float = 20e9
    offload_prefetch_overlap: float = 1.0
    # 1: the collectives model (bytes, latency, overlap per framework) carries multi-GPU cost
    multi_gpu_efficiency: float = 1.0
    # fitted: Qwen rows on 2 nodes; the one fitted flat factor (THROUGHPUT_WHY says why no
    # physical term reproduces those rows)
    multi_node_efficiency: float = 0.503
    notes: tuple[str, ...] = field(default=())

    def matmul_override(self, architecture: str) -> tuple[float, str] | None:
        """A calibrated efficiency (of the dense peak) for this architecture, if one is set."""
        for word, value in self.matmul_efficiency_by_architecture:
            if word.lower() in architecture.lower():
                return value, word
        return None

    def flash_share(self, architecture: str) -> float:
        """FlashAttention-2's share of the matmul ceiling on this architecture."""
        table = dict(self.flash_attention_ceiling_share)
        word = architecture.split()[0] if architecture else ""
        return table.get(word, table["default"])

    def gpu_override(self, gpu_name: str, job: str | None = None) -> tuple[float, str] | None:
        """A calibrated efficiency (of the dense peak) for this very GPU, and its source: the
        one for ``job``'s class when listed, else the GPU's own."""
        if job is not None:
            for name, cls, value, source in self.matmul_efficiency_by_gpu_job:
                if name == gpu_name and cls == job:
                    return value, source
        for name, value, source in self.matmul_efficiency_by_gpu:
            if name == gpu_name:
                return value, source
        return None

    def measured_matmul(self, gpu_name: str) -> MeasuredMatmul | None:
        """The measurement row of a GPU, if one is listed."""
        for row in self.measured_matmul_tflops:
            if row[0] == gpu_name:
                return row
        return None

    def l2_bytes(self, gpu_name: str) -> int | None:
        """The GPU's L2 cache in bytes, if listed."""
        for name, size, _ in self.l2_cache_bytes:
            if name == gpu_name:
                return size
        return None

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
        if len(value[0]) == 2:
            return {str(k): v for k, v in value}
        return {str(row[0]): list(row[1:]) for row in value}
    return value


THROUGHPUT_WHY: dict[str, str] = {
    "measured_matmul_tflops": (
        "the matmul ceiling of each GPU: a published measurement of the largest dense matmul "
        "rate it sustains (stas00/ml-engineering's MAMF table; torch-performance-test-data "
        "submissions for L40S, RTX 4090/5090, A40, L4, V100), at the accumulate type training "
        "uses (GeForce cards: the FP32-accumulate rate, half the FP16-accumulate one)"),
    "sustained_clock_power_exponent": (
        "a GPU with no measurement takes the measured fraction of a sibling (same die, else "
        "same architecture) times ((TDP/peak here) / (TDP/peak there))^this, capped at 1: "
        "dynamic power is C V^2 f and V rises about linearly with f near the top of the DVFS "
        "curve, so the clock a power limit sustains goes as power^(1/3)"),
    "matmul_fraction_default": (
        "measured fraction for a GPU with no measured sibling: the median of the MAMF table's "
        "NVIDIA rows (A100 0.87/0.81, H100 0.80, B200 0.78, B300 0.79, GB200 0.73)"),
    "matmul_step_share": (
        "share of the matmul ceiling an eager PyTorch training step's matmul-bound part reaches "
        "(smaller GEMMs, backward layouts, attention): one value for every GPU, fitted to the "
        "mixed-precision A100 rows (Qwen, torchtune) and L40S rows (PEFT suite): 0.61/0.869 on "
        "the A100 and 0.54/0.743 on the L40S were the old per-architecture fits"),
    "pre_ampere_step_factor": (
        "Volta and Turing on top of the share: no FlashAttention-2 kernels (sm80+), first and "
        "second generation tensor cores that PyTorch's fused kernels feed poorly, fp16 with "
        "loss scaling; fitted to the V100 BERT fp16 rows, the only pre-Ampere rows"),
    "matmul_efficiency_by_architecture": (
        "overrides (fraction of the dense peak) by architecture word; empty by default"),
    "matmul_efficiency_by_gpu_job": (
        "calibrated overrides per GPU and job class (full or adapter training, precision): "
        "the median of the stored CUDA probes of that class on that GPU "
        "(adapters/calibration.py); on one H200 the implied efficiency was 0.78 for every "
        "pure-bf16 full fine-tune, 0.55 for bf16-mixed, 0.46-0.50 for GPU-bound LoRA: the "
        "terms the model leaves to the fitted share differ by class, so a probe calibrates "
        "its own class first"),
    "matmul_efficiency_by_gpu": (
        "calibrated overrides (fraction of the dense peak) per GPU, each with the probes it "
        "comes from (adapters/calibration.py: the median of the CUDA probes on that GPU that "
        "imply one); a GPU listed here is 'calibrated', every other 'assumed'"),
    "assumed_error_range": (
        "range of an uncalibrated time figure: the 10th and 90th percentile of the "
        "leave-one-GPU-out errors (predicted - measured) / measured of "
        "benchmarks/throughput_accuracy.py, where each GPU's rows are predicted by constants "
        "fitted without them"),
    "calibrated_error_range": (
        "range of a calibrated time figure: the 10th and 90th percentile of the in-sample "
        "errors of benchmarks/throughput_accuracy.py (constants fitted with that GPU's own "
        "rows, as a probe calibration fits the efficiency to the GPU's own step)"),
    "hidden_size_half_efficiency": (
        "efficiency x h/(h + this): small hidden sizes give small GEMMs that reach less of the "
        "peak (fitted: Qwen 1.8B vs 7B vs 14B at long sequences)"),
    "causal_attention_factor": (
        "flash/SDPA attention skips masked blocks: QK^T and AV cost half of the full s x s work "
        "(FLOPs convention: 4*s*d_attn per token per layer forward, times this)"),
    "eager_attention_factor": "eager attention computes the full s x s scores, masked or not",
    "flash_attention_ceiling_share": (
        "FlashAttention-2 (flash_attn 2, and sdpa's flash backend) forward + backward reaches "
        "'50-73% of the theoretical maximum FLOPs/s on A100' (Dao 2023, FlashAttention-2, "
        "arXiv 2307.08691, abstract): the middle, 0.615 of 312, over the A100 SXM's measured "
        "matmul ceiling 0.869 (MEASURED_MATMUL_TFLOPS) is 0.71 of the ceiling, used for "
        "Ampere and Ada and any card without its own entry; on Hopper 'FlashAttention-2 "
        "achieving only 35% utilization on the H100' (Shah et al. 2024, FlashAttention-3, "
        "arXiv 2407.08608, abstract): 0.35 / 0.803 = 0.44; Blackwell the same, as FA2 uses "
        "the sm80 mma instructions there too. Not fitted"),
    "elementwise_bandwidth_efficiency": (
        "share of the datasheet HBM/GDDR bandwidth the memory-bound kernels below reach "
        "(eager attention's score kernels, the loss over the logits): a plain device copy "
        "or STREAM triad sustains about 0.9 of the datasheet figure on HBM GPUs, and these "
        "are multi-pass reductions (softmax rereads a row larger than shared memory) at "
        "sizes of a few MB to GB; assumed 0.7, not fitted, low confidence"),
    "elementwise_exposed_share": (
        "share of the elementwise ops' bandwidth time (norms, rotary, activation, residual "
        "adds, dropout, mixed-precision casts: core.compute.elementwise) the step counts: 0, "
        "the fitted matmul_step_share and pre_ampere_step_factor carry it (the terms are "
        "shown with their bandwidth_seconds); counted in full (1) with every fitted constant "
        "refitted the calibration set scored worse (in-sample 5.3 %, leave-one-source-out "
        "6.8 %, leave-one-GPU-out 10.8 % against 4.2, 4.9, 7.9 %; the L40S rows 13.6 % against "
        "6.6 %), and fitted with the step share it was degenerate; module docstring"),
    "l2_cache_bytes": (
        "L2 cache per GPU from NVIDIA's architecture whitepapers (A100 40 MB, H100/H200 50 "
        "MB, AD102 96 MB, RTX 4090 72 MB, AD104 48 MB, GA102 and GV100 6 MB, TU104 4 MB): an "
        "elementwise op whose live tensors fit keeps its kernel chain's intermediates (the "
        "RMSNorm's fp32 copies, the rotary halves) in L2, and only its input and output "
        "reach DRAM; cards not listed get no L2 credit"),
    "l2_resident_share": (
        "an op's intermediates stay in L2 when its live tensors (one layer, the whole "
        "micro-batch) fill at most this share of the L2: the rest holds the GEMMs' tiles "
        "and other tensors; assumed 0.5, not fitted, low confidence"),
    "l2_bandwidth_ratio": (
        "L2 bandwidth over DRAM bandwidth for the intermediates kept in L2: assumed 3 (L2 "
        "runs at several TB/s on A100/H100/Ada parts against 0.3-3.4 TB/s DRAM), not "
        "fitted, low confidence"),
    "eager_score_bytes_forward": (
        "bytes per score element per layer in a forward of transformers' "
        "eager_attention_forward (bf16 = 2 B, fp32 = 4 B): QK^T written 2, x scaling read 2 "
        "write 2, + mask read 2 write 2, softmax(dtype=float32) read 2 write 4, .to(bf16) read "
        "4 write 2, read 2 by the AV matmul = 24 (dropout at p=0 launches nothing); a "
        "recomputed forward moves them again"),
    "eager_score_bytes_backward": (
        "bytes per score element per layer in eager attention's backward: the AV backward "
        "writes the probabilities' gradient 2 and rereads them for dV 2, the cast's backward "
        "read 2 write 4, the softmax backward reads gradient 4 and output 4 and writes 2, the "
        "scaling's backward read 2 write 2, the QK^T backward reads the gradient twice (dQ, "
        "dK) 4 = 28"),
    "standard_loss_bytes_per_logit": (
        "bytes per logit (forward + backward) of transformers' ForCausalLMLoss: "
        "logits.float() read 2 write 4, torch cross_entropy's log_softmax over a row larger "
        "than shared memory reads it 3 times and writes once (16), nll_loss's backward "
        "writes a dense fp32 gradient 4, log_softmax's backward reads gradient, output and "
        "gradient again and writes 16, the cast's backward read 4 write 2 = 48; torchtune's "
        "chunked CE without compile does the same per chunk"),
    "fused_loss_bytes_per_logit": (
        "bytes per logit of a fused cross-entropy (Liger's fused linear cross-entropy, "
        "liger_kernel ops/fused_linear_cross_entropy.py; Unsloth's fast_cross_entropy_loss): "
        "one kernel reads each chunk's bf16 logits twice (online max and sum, then the "
        "gradient) and writes the gradient in place: 2 + 2 + 2 = 6"),
    "compiled_loss_bytes_per_logit": (
        "torchtune's chunked CE under torch.compile: Inductor fuses the upcast, log_softmax "
        "and nll into one reduction reading the bf16 chunk twice (4) and one backward kernel "
        "reading it again and writing its bf16 gradient (4) = 8; derived, low confidence"),
    "fp32_matmul_efficiency": (
        "fp32 runs on CUDA cores (TF32 is off by default for matmuls in PyTorch), which large "
        "GEMMs keep busy more easily than tensor cores: fitted to the V100 BERT fp32 cases"),
    "host_overhead_s_per_adapter_pass": (
        "extra launches per LoRA-adapted linear per pass (dropout, A, B, scale, add, casts)"),
    "host_overlap_exponent": (
        "GPU and host time combine as (gpu^p + host^p)^(1/p): the slower one dominates, with a "
        "soft corner where they are equal"),
    "multi_node_efficiency": (
        "THE ONE FITTED FLAT FACTOR of the speed model (multi_gpu_efficiency is 1): per-GPU "
        "speed of a job on more than one node relative to the same job on one node, beyond "
        "the collectives model (bytes over the node fabric, NCCL's latency per collective, "
        "each framework's overlap); its term is step/multi-node-fitted-slowdown = step x "
        "(1/this - 1). Fitted to Qwen's only multi-node rows (QwenLM/Qwen README, 'Profiling "
        "of Memory and Speed': 'LoRA (multinode)', two servers with two A100-SXM4-80G each, "
        "finetune_lora_ds.sh with ds_config_zero2.json), whose fabric the source does not "
        "state. No physical model is behind it: those rows take 1.74, 2.11, 1.85, 1.78, 1.79, "
        "1.76 x the one-GPU LoRA step at 256..8192 tokens (2.09/1.2 .. 37.4/21.3 s/it), a "
        "slowdown in proportion to compute (16 s extra per step at 8192 tokens, 0.9 s at 256), "
        "while the bytes their ZeRO-2 sends per micro-batch are fixed: 143 M LoRA parameters "
        "= 286 MB of bf16 gradients, under reduce_bucket_size 2e8 one bucket per micro-batch, "
        "whatever the sequence. So no fabric's bandwidth or latency, with or without overlap "
        "(the script's CUDA_DEVICE_MAX_CONNECTIONS=1 serialises the reduction stream with "
        "compute), reproduces it. Readings that would make the work per GPU larger do not fit "
        "either: the script's default per-device batch 2 (the README says 1) is ruled out by "
        "the memory column (155.5 G over 4 GPUs = 38.9 G each at 8192, against 36.6 G for one "
        "GPU at batch 1, where batch 2 would add ~16 G of logits and checkpoints), and twice "
        "the work would make the two-node GPUs 14 % faster per token than the one-GPU run at "
        "8192 tokens; falling back from flash-attention to eager would grow with the square of "
        "the sequence, not stay flat. Applied to every multi-node job, on every fabric, with "
        "low confidence; counted in the bound of the step terms it scales"),
    "host_overhead_s_per_layer_pass": (
        "kernel launches and Python per transformer block per pass (forward, recompute, "
        "backward counted as two) in eager mode; fitted to the Qwen seq-256 cases, where a "
        "step is launch-bound"),
    "compiled_host_overhead_factor": "torch.compile fuses kernels: fewer launches per block",
    "compile_speedup": (
        "torch.compile's saving on the linears (its own term, micro-batch/torch-compile: "
        "matmul x (1/this - 1)): Inductor fuses the norms, activations and casts between the "
        "GEMMs, which the eager matmul time carries; fitted to torchtune's compiled rows (read "
        "off one pair, 7075 -> 8998 tokens/s, it was 1.25); its fused loss is "
        "compiled_loss_bytes_per_logit and its fewer launches compiled_host_overhead_factor"),
    "zero3_hook_s_per_layer_pass": (
        "DeepSpeed ZeRO-3 / FSDP fetch-and-release bookkeeping per block per pass, beyond the "
        "bytes moved (fitted: Qwen 1.8B full ZeRO-3 on one GPU, which moves no bytes)"),
    "padding_factor": (
        "not fitted (it trades off against the GPU efficiency): padding to the longest "
        "sequence in a batch: tokens computed / real tokens when "
        "--no-packing and --avg-tokens are given (capped at --seq-len)"),
    "dequant_bytes_per_param": (
        "LLM.int8 (lora8bit) dequantizes every base weight each pass: read 0.5 B + write 2 B, "
        "plus 0.5 B more for the 1-byte int8 weight; the 4-bit formats count their bytes "
        "exactly (0.5 B packed + absmax constants + the compute-dtype write)"),
    "dequant_bandwidth_efficiency": (
        "GPTQ int4 (auto-gptq QuantLinear): share of HBM bandwidth its dequantize-then-GEMM "
        "path reaches in training (per-layer kernels, fp16 unpacking of int32 words); fitted "
        "to Qwen's Q-LoRA rows, which train the GPTQ Int4 checkpoints through auto-gptq: "
        "about 0.2 s extra per 8B params per micro-batch"),
    "nf4_dequant_bandwidth_efficiency": (
        "bitsandbytes NF4/FP4 (bitsandbytes functional.dequantize_4bit, called by "
        "MatMul4Bit in forward and backward): one streaming kernel per linear and pass that "
        "reads the packed 0.5 B + absmax and writes the compute-dtype weight; derived as the "
        "same share of bandwidth as a foreach optimizer kernel (optimizer_bandwidth_efficiency), "
        "not fitted: no calibration row uses bitsandbytes 4-bit"),
    "int8_matmul_slowdown": "LLM.int8 (lora8bit) matmuls with outlier decomposition vs bf16",
    "dora_bytes_per_adapted_param": (
        "DoRA recomputes ||W + BA|| each pass: read W (2 B), write and read the fp32 sum (8 B)"),
    "optimizer_bandwidth_efficiency": (
        "share of HBM bandwidth a fused/foreach optimizer step reaches"),
    "adapter_exposed_share": (
        "unset (None): elementwise_exposed_share's 0, the fitted matmul share carries the "
        "adapters' "
        "casts, scale and add. Counted in full (1; benchmarks/README.md, 'The adapter path'), "
        "the H200's held-out compute-bound LoRA jobs came within 2.3 % (+20..+30 % too fast "
        "at 0) and the calibration set's in-sample and leave-one-GPU-out medians improved "
        "after a refit (3.4 and 5.7 %, against 4.2 and 7.9), but leave-one-source-out rose "
        "from 4.9 to 12.8 % and the sequential fit did not settle at a fixed point, so it is "
        "not adopted"),
    "optimizer_passes": (
        "SGD, Adafactor and bitsandbytes' 8-bit AdamW (foreach SGD, transformers' Adafactor, "
        "the blockwise 8-bit kernels' per-element requantization) take more than their bytes' "
        "one pass (assumed)"),
    "adamw_fused_passes": (
        "fused AdamW (torch._fused_adamw_) is one multi-tensor kernel: it reads p, g, m, v and "
        "writes p, m, v once, 7 element passes, the unit of the optimizer term's bytes; "
        "bitsandbytes' 32-bit AdamW and Lion (core.compute.step.BNB_FUSED_OPTIMIZERS) are one "
        "kernel per tensor too"),
    "adamw_unfused_passes": (
        "torch 2.x _multi_tensor_adam (torch/optim/adam.py, decoupled weight decay, not "
        "capturable), op by op in element reads + writes: _foreach_mul_(p) 2, "
        "_foreach_lerp_(m, g) 3, _foreach_mul_(v) 2, _foreach_addcmul_(v, g, g) 3, "
        "_foreach_sqrt(v) 2, _foreach_div_ 2, _foreach_add_(eps) 2, "
        "_foreach_addcdiv_(p, m, denom) 4 = 20 against the fused kernel's 7; the single-tensor "
        "loop and transformers' own AdamW run the same ops per tensor. Which implementation a "
        "job runs is the memory model's (core.job.versions.adamw_impl). Replacing the one "
        "assumed 1.5 passes by these two (benchmarks/throughput_accuracy.py): in-sample 4.2 -> "
        "4.2 %, leave-one-source-out 4.9 -> 4.4 %, leave-one-GPU-out 7.9 -> 8.6 %"),
    "nvlink_efficiency": (
        "NCCL bus bandwidth / one-direction NVLink bandwidth (datasheet figures are both "
        "directions, halved first)"),
    "pcie_efficiency": "NCCL bus bandwidth / one-direction PCIe x16 bandwidth (through the host)",
    "pcie_bytes_per_s_by_gen": "one direction of a x16 link by PCIe generation (PCI-SIG rates)",
    "inter_node_bytes_per_s": (
        "per node, when the provider gives no fabric: 100 Gb/s Ethernet (12.5 GB/s)"),
    "inter_node_efficiency": "NCCL bus bandwidth / link bandwidth between nodes",
    "nccl_base_latency_s": (
        "fixed latency of one ring collective, NCCL's own model: baseLat[Ring][Simple] = 8.4 "
        "us (NVIDIA/nccl src/graph/tuning.cc, ncclTopoTuneModel, at commit b6475625)"),
    "nccl_hop_latency_s": (
        "latency per ring step by the link it crosses, NCCL's hwLat[link][Ring][Simple] at "
        "the same commit: NVLink 3.4 us, PCIe 5.7 us, network 14.0 us; a collective over n "
        "ranks on k nodes pays base + (steps - inter) x intra hop + inter x network hop, "
        "steps = n-1 with inter = k-1 (all-gather, reduce-scatter) or 2(n-1) with inter = 2k "
        "(all-reduce, k > 1), as ncclTopoTuneModel counts them; NodeLinks."
        "inter_node_latency_s replaces the network hop where the offer states its fabric's "
        "latency"),
    "overlap_fraction_ddp": "share of backward time DDP's bucketed all-reduce hides behind",
    "overlap_fraction_sharded": "share of compute ZeRO/FSDP prefetch hides gathers behind",
    "cpu_adam_params_per_s": (
        "DeepSpeed CPU Adam update rate per rank when the host's vCPUs are not known: about "
        "17 vCPUs' worth of cpu_adam_params_per_s_per_core, a rank's share of a 128-192 "
        "vCPU host with 8 GPUs; low confidence"),
    "cpu_adam_params_per_s_per_core": (
        "DeepSpeed CPUAdam (0.19, csrc/includes/cpu_adam.h Step_AVX) streams 28 B per "
        "parameter: fp32 grad, exp_avg, exp_avg_sq and weight read, weight and both moments "
        "written. All cores of a socket share its DRAM bandwidth, so the host's bandwidth, "
        "not one core's streaming rate, sets the pace: a 2-socket GPU host has 12-16 DDR4/5 "
        "channels (2x EPYC 7R13 in p5.48xlarge: 16 x DDR4-3200 = 410 GB/s peak for 192 "
        "vCPUs; 2x Xeon 8480C in a DGX H100: 16 x DDR5-4800 = 614 GB/s for 224 vCPUs), "
        "~75 % of peak achievable (STREAM-class): 1.6-2 GB/s per vCPU, / 28 B = 6e7 "
        "parameters/s per vCPU, times the vCPUs one rank gets (NodeLinks.host_vcpus / GPUs "
        "per node): a 70B model's CPU Adam step takes ~6.5 s on one 8-GPU, 192-vCPU node. "
        "Derived, low confidence (AVX-512 hosts and NUMA placement move it)"),
    "host_link_bytes_per_s": "effective GPU<->host copy rate for offloaded states (pinned)",
    "offload_prefetch_overlap": (
        "share of compute that hides parameter copies from the host: DeepSpeed ZeRO-Infinity and "
        "FSDP prefetch the next block's parameters while this one computes "
        "(stage3_prefetch_bucket_size; FSDP backward_prefetch), so only the excess shows"),
    "multi_gpu_efficiency": (
        "flat per-GPU factor with more than one GPU, beyond the collectives model; 1 (none): "
        "communication is timed as bytes over the slowest ring hop plus a latency per "
        "collective, with each framework's overlap, and fitting this factor on the Qwen "
        "multi-GPU rows would hide errors of that model rather than measure anything"),
}
