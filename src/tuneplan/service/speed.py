"""``tuneplan throughput``'s use case: tokens/s, step time, MFU and hours of a job on a GPU,
with the GPU's saved probe calibration when there is one."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tuneplan.core.job.strategy import Job
from tuneplan.errors import InvalidValueError

if TYPE_CHECKING:
    from tuneplan.core.compute.throughput import Throughput


def throughput_for(job: Job, *, fabric: str = "auto",
                   inter_node_bytes_per_s: float | None = None) -> Throughput:
    """Speed of ``job`` on ``job.gpu`` (required): the link inside a node is ``fabric``."""
    from tuneplan.adapters.bundled import resolve_gpu_spec
    from tuneplan.adapters.calibration import calibration_for
    from tuneplan.adapters.hub import resolve_model
    from tuneplan.core.compute.communication import NodeLinks
    from tuneplan.core.compute.throughput import estimate_throughput, model_shape_from_spec

    if not job.gpu:
        raise InvalidValueError("throughput needs --gpu NAME (see `tuneplan gpus`)")
    gpu = resolve_gpu_spec(job.gpu)
    links = NodeLinks(intra=fabric, inter_node_bytes_per_s=inter_node_bytes_per_s)
    shape = model_shape_from_spec(resolve_model(job.model))
    return estimate_throughput(shape, job.strategy, gpu, avg_tokens=job.avg_tokens,
                               links=links, tokens=job.tokens_per_epoch, epochs=job.epochs,
                               assumptions=calibration_for(gpu).throughput)
