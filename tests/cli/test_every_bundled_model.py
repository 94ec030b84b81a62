"""Every bundled model can be estimated: ``tuneplan memory`` and ``tuneplan throughput`` for
each row of the bundled registry (``data/models/INDEX.csv``) x {full, LoRA, QLoRA}.

Each either succeeds or is refused with a reason that names a real limit (``REAL_LIMITS``:
something the libraries themselves cannot do), never with "not estimated yet". The use cases
are called through the service layer (the code both faces run); a few go through the CLI.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Callable
from importlib import resources

import pytest

from tests.cli.conftest import CliResult
from tuneplan.core.job.methods import as_built
from tuneplan.errors import UnsupportedError
from tuneplan.service.jobs import JobRequest
from tuneplan.service.memory_report import run_memory
from tuneplan.service.speed import throughput_for

Run = Callable[..., CliResult]

INDEX = list(csv.DictReader(
    (resources.files("tuneplan.data") / "models" / "INDEX.csv").read_text().splitlines()))
MODELS = [row["hf_id"] for row in INDEX]
METHODS = ("full", "lora", "qlora")
GPU = "H100"   # throughput needs a card; memory is asked without one (no fit verdict)

#: Refusals that name a limit of the libraries, not of tuneplan's model: transformers refuses
#: SDPA for soft-capped attention (Gemma 2), so that job must choose another kernel.
REAL_LIMITS = (re.compile(r"caps its attention logits \(soft-capping\), which SDPA cannot do"),)


def _values(hf_id: str, method: str) -> dict[str, object]:
    from tuneplan.adapters.hub import resolve_model

    spec = resolve_model(hf_id)
    seq = min(2048, spec.max_position_embeddings or 2048)   # within the model's own context
    # an encoder-only model (BERT) has no causal-LM head: its job is sequence classification
    task = {"task": "seq-cls", "num-labels": 2} if spec.is_encoder_only else {}
    return {"method": method, "seq-len": seq, **task}


def _real_limit(exc: UnsupportedError) -> bool:
    return any(p.search(str(exc)) for p in REAL_LIMITS)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("hf_id", MODELS)
def test_memory_and_throughput_for_every_bundled_model(hf_id: str, method: str) -> None:
    values = _values(hf_id, method)
    try:
        est, spec, _ = run_memory(JobRequest(model=hf_id, command="memory", values=values))
    except UnsupportedError as exc:
        assert _real_limit(exc), f"{hf_id} {method}: memory refused: {exc}"
        return
    assert est.device_total_bytes > est.allocated_peak_bytes > 0
    # all of the model, or its language model (a multimodal Gemma 3 trains its text part),
    # as the job's transformers builds it (transformers 5 ties a T5 head: one V x H fewer)
    built = as_built(spec, est.strategy)
    tied = spec.vocab_size * spec.hidden_size if built is not spec else 0
    if spec.is_encoder_only:   # the seq-cls head (pooler + 2-label classifier) replaces MLM's
        assert est.total_params != spec_total(hf_id)
        assert abs(est.total_params - spec_total(hf_id)) < 0.001 * spec_total(hf_id)
    else:
        assert est.total_params in (spec_total(hf_id) - tied,
                                    spec_total(hf_id) - spec.vision_params)
    if method == "full":
        assert est.trainable_params == est.total_params
    else:
        assert 0 < est.trainable_params < est.total_params
    job = JobRequest(model=hf_id, command="throughput", values={**values, "gpu": GPU}).job()
    speed = throughput_for(job)
    assert speed.tokens_per_second > 0 and 0 < speed.mfu < 1


def spec_total(hf_id: str) -> int:
    from tuneplan.adapters.hub import resolve_model
    from tuneplan.core.models import count_parameters

    return count_parameters(resolve_model(hf_id)).total


@pytest.mark.parametrize(("model", "method"), [
    ("THUDM/chatglm3-6b", "qlora"),          # remote-code family mapped onto the decoder
    ("bigcode/starcoder2-7b", "lora"),
    ("ibm-granite/granite-3.3-8b-instruct", "full"),
])
def test_memory_and_throughput_through_the_cli(run_cli: Run, model: str, method: str) -> None:
    memory = run_cli("memory", model, "--method", method, "--gpu", GPU, "--json").ok_json()
    assert memory["model"]["name"] == model
    assert memory["model"]["structure"] == "analytic"
    assert memory["per_gpu"]["device_total_bytes"] > 0
    speed = run_cli("throughput", model, "--method", method, "--gpu", GPU, "--json").ok_json()
    assert speed["tokens_per_second"] > 0
