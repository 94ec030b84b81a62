"""GPU specifications: memory in exact bytes, bandwidth, dense FLOP/s per precision, links.

Pure: ``parse_gpu_specs`` takes the text of ``gpu_specs.csv`` and the memory totals that
``parse_memory_totals`` reads from ``gpu_memory_totals.csv`` (the adapter
``adapters.bundled.load_gpu_specs`` reads the bundled files). Blank cells stay None.

Memory, three figures per card (``data/gpu_memory_totals_README.md`` has the sources):

- ``memory_bytes``: the nominal size, ``vram_gb`` x 2^30 (GPU vendors' "GB" counts binary
  capacity: an A100 80GB reports exactly 81,920 MiB); ``memory_label`` keeps the text.
- ``driver_memory``: the total nvidia-smi shows, ECC on where clouds ship it on (an L40S
  shows 46,068 of its 49,152 MiB: GDDR ECC takes 1/16; an H100 SXM5 81,559 of 81,920 MiB).
- ``usable_memory``: the total CUDA gives a process (``cudaMemGetInfo`` total, torch's "GPU 0
  has a total capacity of X GiB"): the driver total less what the driver keeps for itself
  (an H100 SXM5 shows 79.11 GiB in torch). ``usable_memory_bytes`` is this figure: the CUDA
  context, cuBLAS workspace, NCCL buffers and the caching allocator's reserve all come out of
  it, and they are terms of the memory estimate's whole-device peak.

Each figure says its basis: ``reported`` (a cited device report), ``derived`` (the driver
total was reported, the CUDA reserve is the rule's) or ``assumed`` (nothing reported: the
per-memory-type rule of ``assumed_driver_mib`` / ``cuda_reserve_mib``, low confidence).
"""

from __future__ import annotations

import csv
import io
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import ROUND_FLOOR, Decimal, InvalidOperation

from tuneplan.errors import CatalogError
from tuneplan.units import GB, TERA, GiB, MiB

#: The rule for figures nobody reported, fitted on the sourced rows of gpu_memory_totals.csv
#: so that it never gives more than a sourced row shows (tests/core/test_gpu_memory_totals.py
#: checks it). Driver total = nominal MiB x share (rounded down):
#: HBM 0.986 (V100-SXM2-16GB 16,160 / 16,384 = 0.9863; H100 SXM5 81,559 / 81,920 = 0.9956;
#: H200 143,771 / 144,384 = 0.9958; B200 183,359 / 184,320 = 0.9948); GDDR with ECC on 0.931
#: (ECC takes 1/16: T4 15,360 of 16,384, A10 23,028 and L40S 46,068 of 24,576 / 49,152; AWS
#: lists A10G and L4 at 22,888 and L40S at 45,776, 0.9313); GDDR without ECC 0.995 (RTX 5090
#: 32,607 / 32,768 = 0.9951, RTX PRO 6000 97,887 / 98,304 = 0.9958; GeForce 0.9995-1.0).
#: Where only CUDA's total was reported, the driver total is at least that plus the reserve
#: below (at most the nominal size).
#: Blackwell Ultra shows far less than its 288 (binary) GB: AWS lists the B300 at 275,040 of
#: 294,912 MiB (0.9326), so its own share, 0.932, applies to the GB300 as well.
DRIVER_SHARE_PER_MILLE = {"hbm": 986, "hbm_blackwell_ultra": 932, "gddr_ecc": 931,
                          "gddr": 995}
#: What the driver keeps of its total before CUDA hands memory to a process, MiB: nvidia-smi
#: total less torch's total capacity in the sourced rows, rounded up from the largest seen:
#: HBM 900 (A100 80GB 81,920 - 81,039 = 881; B200 729; H100 NVL 598; H100 SXM5 551),
#: GDDR 600 (L40S 46,068 - 45,486 = 582; RTX 6000 Ada 572; RTX 5090 485; RTX 4090 480; T4 451).
CUDA_RESERVE_MIB = {"hbm": 900, "hbm_blackwell_ultra": 900, "gddr_ecc": 600, "gddr": 600}
_RULE_NAMES = {"hbm": "HBM", "hbm_blackwell_ultra": "Blackwell Ultra HBM (as the B300)",
               "gddr_ecc": "GDDR with ECC on", "gddr": "GDDR without ECC"}
_CONFIDENCE = ("high", "medium", "low")


def memory_class(hbm: bool, ecc: bool, architecture: str = "") -> str:
    """The rule's key: ``hbm`` (``hbm_blackwell_ultra``), ``gddr_ecc`` or ``gddr``."""
    if hbm:
        return "hbm_blackwell_ultra" if architecture.startswith("Blackwell Ultra") else "hbm"
    return "gddr_ecc" if ecc else "gddr"


def assumed_driver_mib(nominal_mib: int, kind: str) -> int:
    """The driver total the rule assumes for a card of ``nominal_mib`` (see DRIVER_SHARE)."""
    return nominal_mib * DRIVER_SHARE_PER_MILLE[kind] // 1000


def cuda_reserve_mib(kind: str) -> int:
    """MiB of the driver total CUDA does not hand out, by the rule (see CUDA_RESERVE_MIB)."""
    return CUDA_RESERVE_MIB[kind]


def rule_text(kind: str) -> str:
    """The rule for ``kind`` in words: ``HBM: driver total = nominal x 0.986, ...``."""
    return (f"{_RULE_NAMES[kind]}: driver total = nominal x "
            f"{DRIVER_SHARE_PER_MILLE[kind] / 1000:.3f}, CUDA-visible = that - "
            f"{CUDA_RESERVE_MIB[kind]} MiB")


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryFigure:
    """One memory total of a card: exact bytes, its basis (``reported``, ``derived``,
    ``assumed``), where it comes from (a URL or the rule) and how sure it is."""

    bytes: int
    basis: str
    source: str
    confidence: str

    @property
    def label(self) -> str:
        """``reported``, or ``assumed (rule ...)`` / ``derived (rule ...)``."""
        return self.basis if self.basis == "reported" else f"{self.basis} ({self.source})"


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryTotals:
    """One row of gpu_memory_totals.csv: what the driver offers, as reported (None = no
    report found), with sources and confidences."""

    gpu: str
    ecc: bool
    driver_mib: int | None
    driver_source: str
    driver_confidence: str
    cuda_mib: int | None
    cuda_source: str
    cuda_confidence: str
    notes: str


def _gib_text_to_mib(text: str) -> int:
    """torch's printed GiB (two decimals) as whole MiB, rounded down: 44.42 -> 45,486."""
    return int((Decimal(text) * 1024).to_integral_value(rounding=ROUND_FLOOR))


def _totals_row(row: dict[str, str], problems: list[str]) -> MemoryTotals | None:
    name = (row.get("gpu") or "").strip()
    ecc = (row.get("ecc") or "").strip().lower()
    if not name or ecc not in ("on", "off"):
        problems.append(f"row {name or '?'}: needs gpu and ecc on/off")
        return None
    values: dict[str, int | None] = {}
    for key, column in (("driver", "driver_total_mib"), ("cuda", "cuda_total_gib")):
        text = (row.get(column) or "").strip()
        source = (row.get(f"{column.rsplit('_', 1)[0]}_source") or "").strip()
        confidence = (row.get(f"{key}_confidence") or "").strip()
        if bool(text) != bool(source) or (text and confidence not in _CONFIDENCE):
            problems.append(f"{name}: {column} needs a value, a source and a confidence "
                            "(high/medium/low) together")
        try:
            values[key] = None if not text else (
                int(text) if key == "driver" else _gib_text_to_mib(text))
        except (ValueError, InvalidOperation):
            problems.append(f"{name}: {column}={text!r} is not a number")
            values[key] = None
    driver, cuda = values["driver"], values["cuda"]
    if driver is not None and cuda is not None and cuda > driver:
        problems.append(f"{name}: CUDA total {cuda} MiB exceeds the driver total {driver} MiB")
    return MemoryTotals(
        gpu=name, ecc=ecc == "on", driver_mib=driver,
        driver_source=(row.get("driver_total_source") or "").strip(),
        driver_confidence=(row.get("driver_confidence") or "").strip(),
        cuda_mib=cuda, cuda_source=(row.get("cuda_total_source") or "").strip(),
        cuda_confidence=(row.get("cuda_confidence") or "").strip(),
        notes=(row.get("notes") or "").strip())


def parse_memory_totals(text: str) -> dict[str, MemoryTotals]:
    """gpu_memory_totals.csv text -> rows by GPU name; CatalogError lists every problem."""
    reader = csv.DictReader(io.StringIO(text))
    needed = ("gpu", "ecc", "driver_total_mib", "driver_total_source", "cuda_total_gib",
              "cuda_total_source")
    missing = [c for c in needed if c not in (reader.fieldnames or ())]
    if missing:
        raise CatalogError(f"GPU memory totals table lacks columns {missing}")
    problems: list[str] = []
    rows: dict[str, MemoryTotals] = {}
    for row in reader:
        found = _totals_row(row, problems)
        if found is None:
            continue
        if found.gpu in rows:
            problems.append(f"duplicate GPU {found.gpu!r}")
        rows[found.gpu] = found
    if problems:
        raise CatalogError("bad GPU memory totals table: " + "; ".join(problems))
    return rows


def memory_figures(nominal_bytes: int, hbm: bool, totals: MemoryTotals | None,
                   architecture: str = "") -> tuple[MemoryFigure, MemoryFigure]:
    """(driver total, CUDA-visible total) of a card: the reported figures where the table has
    them, else the rule's, each labelled with its basis. A card missing from the table is
    taken with ECC on (the smaller GDDR figure)."""
    kind = memory_class(hbm, True if totals is None else totals.ecc, architecture)
    rule = rule_text(kind)
    nominal_mib = nominal_bytes // MiB
    if totals is not None and totals.driver_mib is not None:
        driver = MemoryFigure(bytes=totals.driver_mib * MiB, basis="reported",
                              source=totals.driver_source, confidence=totals.driver_confidence)
    else:
        floor = 0 if totals is None or totals.cuda_mib is None else (
            totals.cuda_mib + cuda_reserve_mib(kind))
        mib = min(nominal_mib, max(assumed_driver_mib(nominal_mib, kind), floor))
        driver = MemoryFigure(bytes=mib * MiB, basis="assumed", source=f"rule {rule}",
                              confidence="low")
    if totals is not None and totals.cuda_mib is not None:
        usable = MemoryFigure(bytes=totals.cuda_mib * MiB, basis="reported",
                              source=totals.cuda_source, confidence=totals.cuda_confidence)
    else:
        driver_mib = driver.bytes // MiB
        usable = MemoryFigure(
            bytes=(driver_mib - cuda_reserve_mib(kind)) * MiB,
            basis="derived" if driver.basis == "reported" else "assumed",
            source=f"rule {rule}", confidence="medium" if driver.basis == "reported" else "low")
    return driver, usable


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuSpec:
    """One accelerator SKU. Rates are dense (no sparsity) peaks; None = not published/unknown."""

    name: str
    vendor: str
    architecture: str
    form_factor: str
    memory_label: str
    memory_bytes: int                # nominal, vram_gb x 2^30
    driver_memory: MemoryFigure      # nvidia-smi total
    usable_memory: MemoryFigure      # CUDA-visible total (cudaMemGetInfo)
    memory_type: str | None
    memory_bandwidth_bytes_per_s: int | None
    fp32_flops_per_s: float | None
    tf32_flops_per_s: float | None
    bf16_flops_per_s: float | None
    fp8_flops_per_s: float | None
    int8_ops_per_s: float | None
    fp4_flops_per_s: float | None
    supports_bf16: bool | None
    supports_fp8: bool | None
    interconnect: str | None
    interconnect_bytes_per_s: int | None
    pcie_gen: int | None
    tdp_w: int | None
    compute_capability: str | None
    confidence: str
    notes: str
    source: str

    @property
    def generation(self) -> str:
        """Generation word the memory model keys its constants by (CUDA context, workspaces):
        the architecture's first word, lower case (``hopper``), or ``default``."""
        words = self.architecture.split()
        return words[0].lower() if words else "default"

    @property
    def driver_memory_bytes(self) -> int:
        """What nvidia-smi shows as the card's total (reported or assumed: ``driver_memory``)."""
        return self.driver_memory.bytes

    @property
    def usable_memory_bytes(self) -> int:
        """What CUDA gives a process, context, workspaces and allocator reserve included: the
        figure a whole-device peak is compared with (``usable_memory`` says its basis)."""
        return self.usable_memory.bytes

    def memory_record(self) -> dict[str, object]:
        """The three memory figures with their bases, sources and confidences (JSON)."""
        return {"nominal_bytes": self.memory_bytes, "nominal_label": self.memory_label,
                "driver_total_bytes": self.driver_memory.bytes,
                "driver_total_basis": self.driver_memory.basis,
                "driver_total_source": self.driver_memory.source,
                "driver_total_confidence": self.driver_memory.confidence,
                "usable_bytes": self.usable_memory.bytes,
                "usable_basis": self.usable_memory.basis,
                "usable_source": self.usable_memory.source,
                "usable_confidence": self.usable_memory.confidence}

    @property
    def is_hbm(self) -> bool:
        """HBM (stacked) memory rather than GDDR."""
        return (self.memory_type or "").upper().startswith("HBM")


_REQUIRED = ("gpu", "vendor", "vram_gb", "memory_type", "source")


def _number(row: dict[str, str], column: str, scale: int, problems: list[str]) -> float | None:
    text = (row.get(column) or "").strip()
    if not text:
        return None
    try:
        value = Decimal(text)
    except InvalidOperation:
        problems.append(f"{row.get('gpu')}: {column}={text!r} is not a number")
        return None
    if not value.is_finite() or value <= 0:
        problems.append(f"{row.get('gpu')}: {column}={text!r} must be > 0")
        return None
    return float(value * scale)


def _flag(text: str | None) -> bool | None:
    lowered = (text or "").strip().lower()
    return True if lowered == "yes" else False if lowered == "no" else None


def _int_or_none(value: float | None) -> int | None:
    return None if value is None else round(value)


def _spec_from_row(row: dict[str, str], problems: list[str],
                   totals: Mapping[str, MemoryTotals]) -> GpuSpec | None:
    name = (row.get("gpu") or "").strip()
    vram = _number(row, "vram_gb", 1, problems)
    if not name or vram is None:
        problems.append(f"row {name or '?'}: needs gpu and vram_gb")
        return None
    memory_bytes = int(Decimal(row["vram_gb"].strip()) * GiB)
    memory_type = (row.get("memory_type") or "").strip() or None
    architecture = (row.get("architecture") or "").strip()
    driver, usable = memory_figures(memory_bytes, (memory_type or "").upper().startswith("HBM"),
                                    totals.get(name), architecture)
    link = (row.get("gpu_interconnect") or "").strip()
    pcie = _number(row, "pcie_gen", 1, problems)
    return GpuSpec(
        name=name, vendor=row["vendor"].strip(),
        architecture=architecture,
        form_factor=(row.get("form_factor") or "").strip(),
        memory_label=f"{row['vram_gb'].strip()} GB", memory_bytes=memory_bytes,
        driver_memory=driver, usable_memory=usable, memory_type=memory_type,
        memory_bandwidth_bytes_per_s=_int_or_none(_number(row, "mem_bw_gbs", GB, problems)),
        fp32_flops_per_s=_number(row, "fp32_tflops", TERA, problems),
        tf32_flops_per_s=_number(row, "tf32_tensor_tflops_dense", TERA, problems),
        bf16_flops_per_s=_number(row, "fp16_bf16_tensor_tflops_dense", TERA, problems),
        fp8_flops_per_s=_number(row, "fp8_tensor_tflops_dense", TERA, problems),
        int8_ops_per_s=_number(row, "int8_tensor_tops_dense", TERA, problems),
        fp4_flops_per_s=_number(row, "fp4_tensor_tflops_dense", TERA, problems),
        supports_bf16=_flag(row.get("bf16_tensor")), supports_fp8=_flag(row.get("fp8_tensor")),
        interconnect=None if link.lower() in ("", "none") else link,
        interconnect_bytes_per_s=_int_or_none(
            _number(row, "interconnect_gbs_per_gpu", GB, problems)),
        pcie_gen=_int_or_none(pcie), tdp_w=_int_or_none(_number(row, "tdp_w", 1, problems)),
        compute_capability=(row.get("compute_capability") or "").strip() or None,
        confidence=(row.get("confidence") or "").strip() or "unknown",
        notes=(row.get("notes") or "").strip(), source=row["source"].strip(),
    )


def parse_gpu_specs(text: str, totals: Mapping[str, MemoryTotals] | None = None
                    ) -> tuple[GpuSpec, ...]:
    """Parse gpu_specs.csv text into GpuSpecs, in file order, with the memory ``totals``
    (``parse_memory_totals``) of their GPUs; a GPU without a row gets the rule's figures.

    Raises CatalogError listing every problem at once (missing columns, non-numbers,
    non-positive values, duplicate names).
    """
    reader = csv.DictReader(io.StringIO(text))
    missing = [c for c in _REQUIRED if c not in (reader.fieldnames or ())]
    if missing:
        raise CatalogError(f"GPU spec table lacks columns {missing}")
    problems: list[str] = []
    specs = [spec for row in reader
             if (spec := _spec_from_row(row, problems, totals or {})) is not None]
    names = [spec.name for spec in specs]
    problems += [f"duplicate GPU {n!r}" for n in sorted({n for n in names if names.count(n) > 1})]
    if problems:
        raise CatalogError("bad GPU spec table: " + "; ".join(problems))
    return tuple(specs)


def spec_by_name(specs: tuple[GpuSpec, ...], name: str) -> GpuSpec:
    """The spec with this canonical name; CatalogError when absent."""
    for spec in specs:
        if spec.name == name:
            return spec
    raise CatalogError(f"no GPU spec named {name!r}: see `tuneplan gpus`")


def card_capacity_bytes(gpu: GpuSpec, listed_bytes: int) -> int:
    """Usable bytes of one card of ``gpu`` in an offer that lists ``listed_bytes`` per GPU:
    the spec's usable (CUDA-visible) total, or the listing when smaller; a listing clearly
    below the nominal size (another memory variant, a partition) keeps the spec's usable
    share of it."""
    if listed_bytes >= gpu.memory_bytes * 0.9:
        return min(gpu.usable_memory_bytes, listed_bytes)
    return listed_bytes * gpu.usable_memory_bytes // gpu.memory_bytes


def usable_phrase(gpu: GpuSpec) -> str:
    """``44.4 GiB usable of 48 GiB (CUDA-visible total, reported)``: the figure a peak is
    compared with, the nominal size and the basis, in words."""
    basis = gpu.usable_memory.basis
    return (f"{gpu.usable_memory_bytes / GiB:.1f} GiB usable of {_gib(gpu.memory_bytes)} GiB "
            f"(CUDA-visible total, {basis}"
            + ("" if basis == "reported" else f" by {gpu.usable_memory.source}") + ")")


def _gib(value: int) -> str:
    text = f"{value / GiB:.1f}"
    return text[:-2] if text.endswith(".0") else text
