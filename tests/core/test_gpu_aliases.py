"""Names that live sources write, and the canonical GPU each must become."""

from __future__ import annotations

import pytest

from tuneplan.core.catalog.gpu_names import normalise_gpu_name
from tuneplan.errors import UnknownGpuError
from tuneplan.units import GiB


@pytest.mark.parametrize(
    ("raw", "hint", "canonical"),
    [
        ("Tesla V100", None, "V100 SXM2 16GB"),              # vast.ai / gpuhunt brand prefix
        ("Tesla V100", 32 * GiB, "V100 SXM2 32GB"),          # memory picks the 32 GB part
        ("A100X", None, "A100 80GB PCIe"),                   # converged A100 card
        ("RTX PRO 6000 WS", None, "RTX PRO 6000 Blackwell"),
        ("GH200 SXM", None, "GH200 (96GB HBM3)"),
        ("NVIDIA H100 80GB HBM3", None, "H100 SXM5"),        # nvidia-smi's own name
        ("H100", 94 * 10**9, "H100 NVL"),                    # 94 GB = 87.5 GiB -> NVL
        ("A100-80GB", None, "A100 80GB SXM4"),
    ],
)
def test_live_source_names(raw: str, hint: int | None, canonical: str) -> None:
    assert normalise_gpu_name(raw, hint) == canonical


def test_unknown_name_is_reported_not_dropped() -> None:
    with pytest.raises(UnknownGpuError, match="Voodoo5"):
        normalise_gpu_name("Voodoo5 6000")
