"""A request for a job, as every face hands it over: a model, the flags given, a job file.

``JobRequest.job()`` is the one way a face turns what a person typed, posted or wrote in a file
into a ``core.job.Job`` (through ``service.jobflags``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tuneplan.core.job.strategy import Job


@dataclass(frozen=True, slots=True, kw_only=True)
class JobRequest:
    """``values`` are flag names (``lora-rank``) to raw values, only those given; ``job_file``
    a YAML/JSON file of more flags that ``values`` override."""

    model: str
    command: str
    values: Mapping[str, Any] = field(default_factory=dict)
    job_file: Path | None = None

    def job(self, *, defaults: Mapping[str, Any] | None = None, model: str | None = None) -> Job:
        """The Job; ``defaults`` are the use case's own (an offer's GPU count), below every
        given flag; ``model`` replaces the request's model name (a resolved hub id)."""
        from tuneplan.service.jobflags import job_from_values, load_job_file

        file_values = load_job_file(self.job_file) if self.job_file is not None else None
        return job_from_values(model if model is not None else self.model, self.values,
                               command=self.command, file_values=file_values,
                               defaults=defaults)
