"""The one alias table: GPU names as sources write them -> our canonical GPU names.

Canonical names are the ``gpu`` column of ``data/gpu_specs.csv`` plus ``data/gpu_specs_extra.csv``
(a test keeps ``CANONICAL_GPUS`` equal to them). Pure: no files; an unknown name raises
``UnknownGpuError`` and is never dropped silently.
"""

from __future__ import annotations

import re

from tuneplan.errors import UnknownGpuError
from tuneplan.units import GiB

#: Every GPU an Offer may name. Order: gpu_specs.csv, then gpu_specs_extra.csv.
CANONICAL_GPUS: tuple[str, ...] = (
    "T4", "V100 SXM2 16GB", "V100 SXM2 32GB", "V100 PCIe 16GB", "V100 PCIe 32GB", "A10", "A10G",
    "L4", "L40", "L40S", "A40", "RTX A6000", "RTX 6000 Ada", "RTX 3090", "RTX 4090", "RTX 5090",
    "A100 40GB PCIe", "A100 40GB SXM4", "A100 80GB PCIe", "A100 80GB SXM4", "H100 PCIe",
    "H100 SXM5", "H100 NVL", "H200 SXM", "H200 NVL", "GH200 (96GB HBM3)", "B200 (HGX)",
    "B300 (HGX)", "GB200 (per Blackwell GPU)", "GB300 (per Blackwell Ultra GPU)", "MI250X",
    "MI300X", "MI325X", "Gaudi 2", "Gaudi 3",
    # gpu_specs_extra.csv: GPUs seen in the offer sources, beyond the first table.
    "K80", "M60", "P4", "P100", "T4G", "A16", "A30", "A800 80GB PCIe", "RTX A2000",
    "RTX A2000 12GB", "RTX A4000", "RTX A4500", "RTX A5000", "RTX 3060", "RTX 3070", "RTX 3080",
    "RTX 3080 12GB", "RTX 4060", "RTX 4060 Ti 16GB", "RTX 4070", "RTX 4070 Ti Super",
    "Quadro RTX 6000", "RTX 4000 Ada", "RTX PRO 6000 Blackwell", "MI355X", "Radeon Instinct MI25",
    "Titan RTX",
    # Cards the live sources (vast.ai, gpuhunt) list beyond the bundled snapshot.
    "RTX 2080 Ti", "RTX 3060 Ti", "RTX 3080 Ti", "RTX 3090 Ti", "RTX 4070 Ti", "RTX 4080",
    "RTX 4080 Super", "RTX 5080", "RTX 5000 Ada", "MI100", "MI210", "MI250", "MI350X",
    "RTX 3070 Ti", "RTX 4060 Ti 8GB", "RTX 4070 Super", "RTX 5070", "RTX 5070 Ti", "RTX 2000 Ada",
    "RTX 2060", "RTX 2060 12GB", "RTX 2060 Super", "RTX 2070", "RTX 2070 Super", "RTX 2080",
    "RTX 2080 Super", "RTX 3050", "RTX 3050 6GB", "RTX 3060 8GB", "RTX 5060", "RTX 5060 Ti 8GB",
    "RTX 5060 Ti 16GB",
)
_CANONICAL_SET = frozenset(CANONICAL_GPUS)

# A variant list is ((upper bound of the per-GPU memory hint in bytes, exclusive) | None, name),
# tried in order; the first entry is the default when the source gives no memory hint.
_Variants = tuple[tuple[int | None, str], ...]


def _by_memory(small: str, limit_gib: int, large: str) -> _Variants:
    return ((limit_gib * GiB, small), (None, large))


# Keys are written as ``gpu_name_key`` produces them (lowercase, no spaces, dashes, dots).
# H100 vs NVL splits at 87 GiB: "80GB" may come as 80 GiB, "94GB" as 94·10^9 B = 87.5 GiB.
# Default form factors where a source says nothing: SXM for A100/H100/H200/V100, because the
# multi-GPU cloud nodes that name a bare "H100" are HGX boards; importers that see "PCIe"/"NVL"
# in an instance name pass it along in ``raw``.
GPU_ALIASES: dict[str, _Variants] = {
    "t4": ((None, "T4"),), "teslat4": ((None, "T4"),), "t4g": ((None, "T4G"),),
    # vast.ai and gpuhunt write the Volta/Ampere data-centre parts with their old "Tesla" brand.
    "teslav100": _by_memory("V100 SXM2 16GB", 24, "V100 SXM2 32GB"),
    # A100X is the A100 80GB PCIe converged card (A100 + ConnectX-6 DX on one board).
    "a100x": ((None, "A100 80GB PCIe"),),
    "gh200sxm": ((100 * GiB, "GH200 (96GB HBM3)"),),
    "rtxpro6000ws": ((None, "RTX PRO 6000 Blackwell"),),
    "geforcetitanrtx": ((None, "Titan RTX"),), "titanrtx24gb": ((None, "Titan RTX"),),
    "v100": _by_memory("V100 SXM2 16GB", 24, "V100 SXM2 32GB"),
    "v100sxm2": _by_memory("V100 SXM2 16GB", 24, "V100 SXM2 32GB"),
    "v10032gb": ((None, "V100 SXM2 32GB"),), "v100sxm232gb": ((None, "V100 SXM2 32GB"),),
    "v100sxm216gb": ((None, "V100 SXM2 16GB"),),
    "v100pcie": _by_memory("V100 PCIe 16GB", 24, "V100 PCIe 32GB"),
    "a10": ((None, "A10"),), "a10g": ((None, "A10G"),), "l4": ((None, "L4"),),
    "l40": ((None, "L40"),), "l40s": ((None, "L40S"),), "a40": ((None, "A40"),),
    "a6000": ((None, "RTX A6000"),), "rtxa6000": ((None, "RTX A6000"),),
    "rtx6000ada": ((None, "RTX 6000 Ada"),), "rtx6000adageneration": ((None, "RTX 6000 Ada"),),
    "rtx3090": ((None, "RTX 3090"),), "geforcertx3090": ((None, "RTX 3090"),),
    "rtx4090": ((None, "RTX 4090"),), "geforcertx4090": ((None, "RTX 4090"),),
    "rtx5090": ((None, "RTX 5090"),), "geforcertx5090": ((None, "RTX 5090"),),
    "a100": _by_memory("A100 40GB SXM4", 60, "A100 80GB SXM4"),
    "a100sxm4": _by_memory("A100 40GB SXM4", 60, "A100 80GB SXM4"),
    "a100sxm": _by_memory("A100 40GB SXM4", 60, "A100 80GB SXM4"),
    "a100pcie": _by_memory("A100 40GB PCIe", 60, "A100 80GB PCIe"),
    "a10040gb": ((None, "A100 40GB SXM4"),), "a10040gbsxm4": ((None, "A100 40GB SXM4"),),
    "a10040gbpcie": ((None, "A100 40GB PCIe"),),
    "a10080gb": ((None, "A100 80GB SXM4"),), "a10080gbsxm": ((None, "A100 80GB SXM4"),),
    "a10080gbsxm4": ((None, "A100 80GB SXM4"),), "a10080gbpcie": ((None, "A100 80GB PCIe"),),
    "a10080gpcie": ((None, "A100 80GB PCIe"),), "a10080gpcienvlink": ((None, "A100 80GB PCIe"),),
    "h100": _by_memory("H100 SXM5", 87, "H100 NVL"), "h100sxm": ((None, "H100 SXM5"),),
    "h100sxm5": ((None, "H100 SXM5"),), "h10080gsxm5": ((None, "H100 SXM5"),),
    "h10080gbhbm3": ((None, "H100 SXM5"),), "nvidiah10080gbhbm3": ((None, "H100 SXM5"),),
    "h100mega": ((None, "H100 SXM5"),), "h100pcie": ((None, "H100 PCIe"),),
    "h10080gpcie": ((None, "H100 PCIe"),), "h10080gpcienvlink": ((None, "H100 PCIe"),),
    "h100nvl": ((None, "H100 NVL"),),
    "h200": ((None, "H200 SXM"),), "h200sxm": ((None, "H200 SXM"),),
    "h200nvl": ((None, "H200 NVL"),),
    "gh200": ((100 * GiB, "GH200 (96GB HBM3)"),),
    "b200": ((None, "B200 (HGX)"),), "b300": ((None, "B300 (HGX)"),),
    "gb200": ((None, "GB200 (per Blackwell GPU)"),),
    "gb300": ((None, "GB300 (per Blackwell Ultra GPU)"),),
    "mi250x": ((None, "MI250X"),), "mi300x": ((None, "MI300X"),), "mi325x": ((None, "MI325X"),),
    "gaudi2": ((None, "Gaudi 2"),), "gaudi3": ((None, "Gaudi 3"),),
    "k80": ((None, "K80"),), "m60": ((None, "M60"),), "p4": ((None, "P4"),),
    "p100": ((None, "P100"),),
    "a16": ((None, "A16"),), "a30": ((None, "A30"),), "a800": ((None, "A800 80GB PCIe"),),
    "rtxa2000": _by_memory("RTX A2000", 9, "RTX A2000 12GB"),
    "a4000": ((None, "RTX A4000"),), "rtxa4000": ((None, "RTX A4000"),),
    # gpuhunt 0.1.34 (constraints.py KNOWN_NVIDIA_GPUS) drops the "RTX" of the Ampere
    # workstation cards: A4000, A4500, A5000, A6000.
    "rtxa4500": ((None, "RTX A4500"),), "a4500": ((None, "RTX A4500"),),
    "a2000": _by_memory("RTX A2000", 9, "RTX A2000 12GB"), "a5000": ((None, "RTX A5000"),),
    "rtxa5000": ((None, "RTX A5000"),), "rtx3060": _by_memory("RTX 3060 8GB", 10, "RTX 3060"),
    "rtx2060": _by_memory("RTX 2060", 9, "RTX 2060 12GB"),
    "rtx3050": _by_memory("RTX 3050 6GB", 7, "RTX 3050"),
    "rtx5060ti": _by_memory("RTX 5060 Ti 8GB", 12, "RTX 5060 Ti 16GB"),
    "rtx3070": ((None, "RTX 3070"),), "rtx3080": _by_memory("RTX 3080", 11, "RTX 3080 12GB"),
    "rtx4060": _by_memory("RTX 4060", 12, "RTX 4060 Ti 16GB"),
    "rtx4060ti": _by_memory("RTX 4060 Ti 8GB", 12, "RTX 4060 Ti 16GB"),
    "rtx2000ada": ((None, "RTX 2000 Ada"),), "rtx2000adageneration": ((None, "RTX 2000 Ada"),),
    "rtx4070": _by_memory("RTX 4070", 14, "RTX 4070 Ti Super"),
    "rtx6000": ((None, "Quadro RTX 6000"),), "quadrortx6000": ((None, "Quadro RTX 6000"),),
    "rtx4000ada": ((None, "RTX 4000 Ada"),), "rtx4000adageneration": ((None, "RTX 4000 Ada"),),
    "rtx5000adageneration": ((None, "RTX 5000 Ada"),),
    "rtxpro6000": ((None, "RTX PRO 6000 Blackwell"),),
    "rtxpro600096gb": ((None, "RTX PRO 6000 Blackwell"),),
    "rtxpro6000wk": ((None, "RTX PRO 6000 Blackwell"),),
    "rtxpro6000s": ((None, "RTX PRO 6000 Blackwell"),),
    "mi355x": ((None, "MI355X"),), "radeonmi25": ((None, "Radeon Instinct MI25"),),
    "mi25": ((None, "Radeon Instinct MI25"),),
}

#: Where the variant a bare name means without a memory hint is not the smallest: the card sold
#: under the plain name (the 12 GB RTX 3060 and the 8 GB RTX 3050 came first; the other sizes
#: are later, rarer cards), so that a canonical name respelled still maps to itself.
_DEFAULT_VARIANT: dict[str, str] = {"rtx3060": "RTX 3060", "rtx3050": "RTX 3050"}


def gpu_name_key(raw: str) -> str:
    """The form ``GPU_ALIASES`` keys are written in: lowercase, no spaces, dashes, underscores
    or dots, no leading "nvidia" (``NVIDIA H100-80GB`` -> ``h10080gb``)."""
    return re.sub(r"[\s_\-.]+", "", raw).lower().removeprefix("nvidia")


_CANONICAL_BY_KEY = {gpu_name_key(name): name for name in CANONICAL_GPUS}


def normalise_gpu_name(raw: str, memory_hint_bytes: int | None = None) -> str:
    """Map a source's GPU name to a canonical GPU name (a ``gpu`` of gpu_specs).

    ``memory_hint_bytes`` (per GPU, as the source states it) picks between variants that share a
    name (A100 40 vs 80 GB, V100 16 vs 32 GB, H100 vs H100 NVL); without it the first (default)
    variant is taken. Canonical names map to themselves. Raises UnknownGpuError otherwise.
    """
    if raw in _CANONICAL_SET:
        return raw
    key = gpu_name_key(raw)
    variants = GPU_ALIASES.get(key)
    if variants is None:
        if key in _CANONICAL_BY_KEY:
            return _CANONICAL_BY_KEY[key]
        raise UnknownGpuError(f"unknown GPU name {raw!r}: add it to GPU_ALIASES", raw=raw)
    if memory_hint_bytes is None or memory_hint_bytes <= 0:
        return _DEFAULT_VARIANT.get(key, variants[0][1])
    for limit, name in variants:
        if limit is None or memory_hint_bytes < limit:
            return name
    raise UnknownGpuError(
        f"GPU {raw!r} with {memory_hint_bytes / GiB:.1f} GiB per GPU matches no known variant",
        raw=raw,
    )


def gpu_matches(query: str, canonical: str) -> bool:
    """Does a user's ``--gpu`` query select this canonical GPU?

    Word-prefix match, case-insensitive: ``H100`` selects H100 PCIe, H100 SXM5 and H100 NVL
    (not GH200 or H200); ``A100 80`` selects both 80 GB A100s; ``A10`` selects only the A10.
    A query that is an alias (``A100-80GB``) selects the GPU it normalises to.
    """
    words = query.lower().replace("-", " ").replace("_", " ").split()
    target = canonical.lower().replace("-", " ").split()
    if words and len(words) <= len(target):
        head, last = words[:-1], words[-1]
        prefix = target[: len(head)] == head and target[len(head)].startswith(last)
        if prefix and (len(words) > 1 or target[0] == last):
            return True
    try:
        return normalise_gpu_name(query) == canonical
    except UnknownGpuError:
        return False
