"""The local-disk checkpoint store's shell, run for real in bash: ``aws`` is a stand-in that
logs each push, the training command a stand-in that exits at once (a framework's own run,
which never writes train.py's saved-on-SIGTERM flag). The store loop's last push must follow
the command's exit, not wait out the grace period for a flag that cannot come, and the task
exits with the command's own code."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from tests.waiting import HANG_GUARD_S, wait_until
from tuneplan.adapters.plans import saved_plan_from_entry
from tuneplan.core.launch.bundle import launch_spec
from tuneplan.core.launch.clouds import STORE_SCRIPT, launch_lines, store_script
from tuneplan.core.launch.engines import SKYPILOT_ENV
from tuneplan.core.launch.native import NativeRun
from tuneplan.core.launch.targets import Storage

FIXTURE = Path(__file__).parents[1] / "fixtures" / "launch" / "plan_llama8b_qlora_aws.json"
pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def _spec():  # type: ignore[no-untyped-def]
    doc = json.loads(FIXTURE.read_text())
    return launch_spec(saved_plan_from_entry({"job": doc["job"], **doc["plans"][0]}))


def _native(code: int) -> NativeRun:
    return NativeRun(tool="litgpt", version="0.5.13", config_file="litgpt.yaml", config={},
                     command=("sh", "-c", f"echo trained >> $TUNEPLAN_CHECKPOINT_DIR/log; "
                                          f"exit {code}"),
                     prelude=(), requirements=(), output_dir="/checkpoints/x", resume="",
                     data="")


#: A grace period no test run could wait out: only the command's exit ends the wait.
NO_GRACE_END_S = "100000"


def _task(tmp_path: Path, native: NativeRun) -> tuple[Path, str, dict[str, str], Path]:
    """(the task's folder, the shell lines of a local-disk + sync start of ``native``, their
    environment, the stand-in ``aws``'s log of syncs)."""
    work = tmp_path / "task"
    (work / "bin").mkdir(parents=True)
    pushes = tmp_path / "pushes.log"
    fake_aws = work / "bin" / "aws"
    fake_aws.write_text(f'#!/usr/bin/env bash\necho "$*" >> "{pushes}"\n')
    fake_aws.chmod(0o755)
    spec = _spec()
    (work / STORE_SCRIPT).write_text(store_script(spec))
    script = "\n".join(launch_lines(spec, "accelerate", Storage.LOCAL_SYNC, SKYPILOT_ENV,
                                    native)) + "\n"
    env = {"PATH": f"{work / 'bin'}:{os.environ['PATH']}", "HOME": str(tmp_path),
           "TUNEPLAN_CHECKPOINT_DIR": str(tmp_path / "ckpt"),
           "TUNEPLAN_SYNC_URL": "s3://bucket/run", "TUNEPLAN_SYNC_EVERY_S": NO_GRACE_END_S,
           "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": NO_GRACE_END_S}
    return work, script, env, pushes


def _final_push(tmp_path: Path) -> str:
    return f"s3 sync {tmp_path / 'ckpt'} s3://bucket/run --delete --only-show-errors"


@pytest.mark.parametrize("code", [0, 3])
def test_the_last_push_follows_a_native_runs_exit_without_waiting_for_a_flag(
        tmp_path: Path, code: int) -> None:
    work, script, env, pushes = _task(tmp_path, _native(code))
    done = subprocess.run(["bash", "-c", script], cwd=work, env=env, timeout=HANG_GUARD_S,
                          capture_output=True, text=True)
    assert done.returncode == code
    # one pull (sync URL -> folder), then the final push (folder -> URL) once the run exited
    assert pushes.read_text().splitlines() == [
        f"s3 sync s3://bucket/run {tmp_path / 'ckpt'} --only-show-errors", _final_push(tmp_path)]
    assert (tmp_path / "ckpt" / "log").read_text() == "trained\n"


def test_a_stale_exit_marker_from_an_earlier_start_is_removed_before_training(
        tmp_path: Path) -> None:
    """The marker of the previous start must not cut short this start's wait for train.py's
    SIGTERM save: the task removes it before the store loop starts."""
    work = tmp_path / "task"
    work.mkdir()
    marker = work / ".tuneplan_preempted.exited"
    marker.write_text("")
    lines = launch_lines(_spec(), "accelerate", Storage.LOCAL_SYNC, SKYPILOT_ENV, _native(0))
    first_rm = next(i for i, line in enumerate(lines) if line.startswith("rm -f"))
    loop = next(i for i, line in enumerate(lines) if f"{STORE_SCRIPT} loop" in line)
    assert first_rm < loop
    subprocess.run(["bash", "-c", lines[first_rm]], cwd=work, check=True,
                   env={"PATH": os.environ["PATH"]})
    assert not marker.exists()


def test_a_preempted_native_run_is_pushed_once_it_has_stopped(tmp_path: Path) -> None:
    """The scheduler's SIGTERM reaches the whole task (its process group): the framework's run
    stops (143), the task lives on (it traps SIGTERM), and the store loop's last push follows
    at once; the task exits with the run's code, so the scheduler sees a preemption."""
    import signal

    started = tmp_path / "started"
    # the stand-in run waits in one-second sleeps, so a SIGTERM that lands between two
    # commands runs its trap at the next boundary (with ``sleep 1000 & wait`` a signal landing
    # while sh forks the sleep could leave sh waiting on it for 1000 s: seen once in CI)
    run = replace(_native(0), command=(
        "sh", "-c", f"trap 'exit 143' TERM; touch {started}; while :; do sleep 1; done"))
    work, script, env, pushes = _task(tmp_path, run)
    task = subprocess.Popen(["bash", "-c", script], cwd=work, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        wait_until(started.exists, "the stand-in run starting")
        os.killpg(task.pid, signal.SIGTERM)
        assert task.wait(timeout=HANG_GUARD_S) == 143
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(task.pid, signal.SIGKILL)
    assert pushes.read_text().splitlines()[-1] == _final_push(tmp_path)


def test_shell_line_keeps_every_word_one_argument(tmp_path: Path) -> None:
    """bash reads ``shell_line(argv)`` back as argv: a word with spaces, quotes or ``;`` stays
    one argument (a plain join ran ``sh -c trap ...`` as several commands of the outer shell),
    and a ``$VAR`` word is expanded once, never split."""
    from tuneplan.core.launch.engines import shell_line

    argv = ["printf", "%s\\n", "sh", "-c", "trap 'exit 143' TERM; sleep 1", "two words",
            'a "quoted" `tick` \\ word', "$HOME/x y", "--k=v", ""]
    line = shell_line(argv)
    out = subprocess.run(["bash", "-c", line], capture_output=True, text=True, check=True,
                         env={**os.environ, "HOME": "/h o"}).stdout
    assert out.split("\n")[:-1] == [*argv[2:-3], "/h o/x y", "--k=v", ""]
