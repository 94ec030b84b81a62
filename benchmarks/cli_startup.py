"""CPU seconds of whole `tuneplan` processes: start-up (`--help`) and the README's plan.

Run by hand: ``.venv/bin/python benchmarks/cli_startup.py [--runs 5]``. Prints the median user+
system CPU of each command over the runs (children's rusage, so a busy machine's waiting is not
counted). Targets: `tuneplan --help` <= 0.3 s CPU; the whole-catalog QLoRA plan
<= 1.0 s CPU including start-up.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

TUNEPLAN = str(Path(sys.executable).parent / "tuneplan")
COMMANDS = {
    "tuneplan --help": [TUNEPLAN, "--help"],
    "tuneplan memory --help": [TUNEPLAN, "memory", "--help"],
    "tuneplan plan 8B qlora 50M": [TUNEPLAN, "plan", "meta-llama/Llama-3.1-8B", "--method",
                                   "qlora", "--tokens", "50M", "--json"],
}


def cpu_seconds(argv: list[str], env: dict[str, str]) -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    runs = parser.parse_args().runs
    with tempfile.TemporaryDirectory() as home:
        env = os.environ | {"TUNEPLAN_HOME": home, "HF_HUB_OFFLINE": "1"}
        subprocess.run(COMMANDS["tuneplan plan 8B qlora 50M"], env=env, check=True,
                       stdout=subprocess.DEVNULL)  # seeds the catalog once, as a user's first run
        for label, argv in COMMANDS.items():
            times = [cpu_seconds(argv, env) for _ in range(runs)]
            print(f"{label:32s} median {statistics.median(times):.3f} s CPU "
                  f"(min {min(times):.3f}, max {max(times):.3f}, {runs} runs)")


if __name__ == "__main__":
    main()
