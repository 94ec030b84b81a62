"""Build DeepSpeed's CPU ops once, at install time, before the suite runs.

DeepSpeed compiles its CPU Adam and shared-memory collectives on first use (a JIT build with
ninja and the C++ compiler, 1-3 minutes on two cores) into ``~/.cache/torch_extensions``; the
tests that start DeepSpeed under CPU offload or on gloo ranks then load the cached build.
DeepSpeed's own alternative is pre-building the ops while installing it (``DS_BUILD_CPU_ADAM=1``
and a build without isolation); this does the same with the JIT builder the tests use, so the
build is the one they load (same flags, same ninja: run it with the test venv active).

Without a C++ compiler or ninja it says so and exits 0: those tests skip themselves.
"""

from __future__ import annotations

import os
import shutil
import sys


def main() -> int:
    try:
        import ninja  # noqa: F401
    except ImportError:
        if shutil.which("ninja") is None:
            print("prebuild: no ninja; DeepSpeed's CPU ops are left to the tests (they skip)")
            return 0
    if shutil.which("c++") is None and shutil.which("g++") is None:
        print("prebuild: no C++ compiler; DeepSpeed's CPU ops are left to the tests (they skip)")
        return 0
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    try:
        from deepspeed.ops.op_builder.cpu import (  # type: ignore[import-untyped]
            CPUAdamBuilder,
            ShareMemCommBuilder,
        )
    except ImportError:
        print("prebuild: DeepSpeed is not installed; nothing to build")
        return 0
    for builder in (CPUAdamBuilder(), ShareMemCommBuilder()):
        builder.load(verbose=False)
    print("prebuild: DeepSpeed CPU Adam and shared-memory comm built")
    return 0


if __name__ == "__main__":
    sys.exit(main())
