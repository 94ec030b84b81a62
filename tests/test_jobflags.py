"""service/jobflags.py: every accepted job flag is documented in the shared --help epilog."""

from __future__ import annotations

import re

from tuneplan.service import jobflags


def test_help_names_every_accepted_job_flag() -> None:
    # The epilog abbreviates the LoRA flags as --lora-rank/-alpha/-dropout/-targets.
    text = jobflags.JOB_FLAGS_HELP.replace(
        "--lora-rank/-alpha/-dropout/-targets",
        "--lora-rank --lora-alpha --lora-dropout --lora-targets")
    accepted = (*jobflags._VALUE, *jobflags._BOOL, *jobflags._IGNORED_VALUE,
                "gradient-checkpointing", "offload-activations")
    missing = [name for name in accepted if not re.search(rf"--{name}(?![\w-])", text)]
    assert missing == []
