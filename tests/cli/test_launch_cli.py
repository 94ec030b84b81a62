"""`tuneplan launch`: writes a bundle from a --plan file or the last saved plan; refuses a
non-empty folder unless --force; an unknown plan id is exit 2 with one line."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.cli.conftest import CliResult

Run = Callable[..., CliResult]
FIXTURE = Path(__file__).parent.parent / "fixtures" / "launch" / "plan_llama8b_qlora_aws.json"


def test_launch_from_a_plan_file_writes_the_bundle(run_cli: Run, tmp_path: Path) -> None:
    out = tmp_path / "bundle"
    result = run_cli("launch", "d03e2a81c965", "--plan", str(FIXTURE), "--to", "skypilot",
                     "--out", str(out), "--json")
    assert result.code == 0, result.stderr
    doc = result.json()
    assert doc["plan_id"] == "d03e2a81c965" and doc["targets"] == ["skypilot"]
    assert set(doc["files"]) == {"train.py", "train_config.json", "requirements.txt",
                                 "accelerate_config.yaml", "preemptible.sh", "sky.yaml",
                                 "RUN.md"}
    assert sorted(p.name for p in out.iterdir()) == sorted(doc["files"])
    cfg = json.loads((out / "train_config.json").read_text())
    assert cfg["plan_id"] == "d03e2a81c965" and cfg["method"] == "qlora"
    assert (out / "train.py").stat().st_mode & 0o111
    assert (out / "preemptible.sh").stat().st_mode & 0o111


def test_non_empty_folder_is_refused_unless_forced(run_cli: Run, tmp_path: Path) -> None:
    (tmp_path / "keep.txt").write_text("mine")
    refused = run_cli("launch", "--plan", str(FIXTURE), "--out", str(tmp_path))
    assert refused.code == 2
    assert refused.stderr.count("\n") == 1 and "--force" in refused.stderr
    forced = run_cli("launch", "--plan", str(FIXTURE), "--out", str(tmp_path), "--force")
    assert forced.code == 0, forced.stderr
    assert (tmp_path / "keep.txt").read_text() == "mine" and (tmp_path / "RUN.md").exists()


def test_unknown_plan_id_is_exit_2_one_line(run_cli: Run, tmp_path: Path) -> None:
    result = run_cli("launch", "000000000000", "--plan", str(FIXTURE), "--out",
                     str(tmp_path / "x"))
    assert result.code == 2 and result.stderr.count("\n") == 1
    assert "000000000000" in result.stderr and not (tmp_path / "x").exists()
    bad_target = run_cli("launch", "--plan", str(FIXTURE), "--to", "slurm", "--out",
                         str(tmp_path / "y"))
    assert bad_target.code == 2 and "slurm" in bad_target.stderr


def test_launch_by_id_reads_the_last_saved_plan(run_cli: Run, tmp_path: Path) -> None:
    from tuneplan.adapters.plans import save_last_plan

    save_last_plan(json.loads(FIXTURE.read_text()))
    result = run_cli("launch", "591488aa26ff", "--to", "dstack", "--out", str(tmp_path / "b"),
                     "--json")
    assert result.code == 0, result.stderr
    assert result.json()["plan_id"] == "591488aa26ff"
    assert (tmp_path / "b" / ".dstack.yml").exists()
    missing = run_cli("launch", "ffffffffffff", "--out", str(tmp_path / "c"))
    assert missing.code == 2 and "ffffffffffff" in missing.stderr


def test_a_tool_that_cannot_run_the_offer_is_exit_2_alone_and_left_out_under_all(
        run_cli: Run, tmp_path: Path) -> None:
    """A 4-node plan moved to RunPod: SkyPilot runs no multi-node clusters there."""
    doc = json.loads((FIXTURE.parent / "plan_llama70b_multinode_aws.json").read_text())
    entry = doc["plans"][0]
    entry["offer"] = {k: v for k, v in entry["offer"].items() if k != "id"} | {
        "provider": "RunPod"}  # its id follows from the fields
    moved = tmp_path / "runpod.json"
    moved.write_text(json.dumps({"job": doc["job"], **entry}))
    refused = run_cli("launch", "--plan", str(moved), "--to", "skypilot", "--out",
                      str(tmp_path / "a"))
    assert refused.code == 2 and refused.stderr.count("\n") == 1
    assert "SkyPilot does not run multi-node clusters on runpod" in refused.stderr
    assert not (tmp_path / "a").exists()
    done = run_cli("launch", "--plan", str(moved), "--to", "all", "--out", str(tmp_path / "b"))
    assert done.code == 0, done.stderr
    # the success line names what was written, and SkyPilot only as left out
    assert "(accelerate, deepspeed, dstack, axolotl, llamafactory; left out: skypilot " \
        "(RUN.md says why))" in " ".join(done.stdout.split())
    as_json = run_cli("launch", "--plan", str(moved), "--to", "all", "--out",
                      str(tmp_path / "c"), "--json")
    assert as_json.code == 0, as_json.stderr
    assert as_json.json()["left_out"] == ["skypilot"]
    assert "skypilot" not in as_json.json()["targets"]
    assert "dstack" in as_json.json()["targets"]
    assert not (tmp_path / "b" / "sky.yaml").exists()
    assert (tmp_path / "b" / ".dstack.yml").exists()  # dstack shares one RunPod volume
    assert "SkyPilot: no files written" in (tmp_path / "b" / "RUN.md").read_text()


def test_axolotl_and_llamafactory_configs_are_written_or_refused_in_one_line(
        run_cli: Run, tmp_path: Path) -> None:
    result = run_cli("launch", "b9d2e2d7f4db", "--plan", str(FIXTURE), "--to",
                     "axolotl,llamafactory", "--out", str(tmp_path / "a"), "--json")
    assert result.code == 0, result.stderr
    assert result.json()["targets"] == ["axolotl", "llamafactory"]
    assert {"axolotl.yaml", "llamafactory.yaml", "dataset_info.json"} <= set(
        result.json()["files"])
    info = json.loads((tmp_path / "a" / "dataset_info.json").read_text())
    assert info["tuneplan_train"]["file_name"] == "data/train.jsonl"
    doc = json.loads(FIXTURE.read_text())
    entry = doc["plans"][0]
    entry["strategy"] = entry["strategy"] | {"method": "prefix"}
    prefix = tmp_path / "prefix.json"
    prefix.write_text(json.dumps({"job": doc["job"], **entry}))
    refused = run_cli("launch", "--plan", str(prefix), "--to", "llamafactory", "--out",
                      str(tmp_path / "b"))
    assert refused.code == 2 and refused.stderr.count("\n") == 1
    assert "llamafactory cannot launch plan" in refused.stderr and "prefix" in refused.stderr
    assert not (tmp_path / "b").exists()


def _with_recipe(tmp_path: Path, recipe: str, **strategy: object) -> Path:
    doc = json.loads(FIXTURE.read_text())
    entry = doc["plans"][0]
    entry["strategy"] = entry["strategy"] | {"recipe": recipe, **strategy}
    path = tmp_path / f"{recipe}.json"
    path.write_text(json.dumps({"job": doc["job"], **entry}))
    return path


@pytest.mark.parametrize("recipe", ["litgpt", "torchtune", "unsloth"])
def test_a_plan_of_another_recipe_is_never_launched_with_the_hf_trainer(
        run_cli: Run, tmp_path: Path, recipe: str) -> None:
    """The plan's memory is that framework's own layout; train.py (and every file run around
    it) is the HF Trainer + PEFT: refused in one line, exit 2, nothing written (this QLoRA
    plan under bf16-mixed on spot has no litgpt or torchtune run either)."""
    plan = _with_recipe(tmp_path, recipe)
    for to in ("accelerate", "deepspeed", "axolotl", "llamafactory", "all"):
        out = tmp_path / f"out-{to}"
        refused = run_cli("launch", "--plan", str(plan), "--to", to, "--out", str(out))
        assert refused.code == 2, (to, refused.stdout)
        assert refused.stderr.count("\n") == 1, refused.stderr
        assert f"--recipe {recipe}" in refused.stderr and "--recipe hf" in refused.stderr
        assert not out.exists()
    hf = run_cli("launch", "--plan", str(_with_recipe(tmp_path, "plain")), "--to",
                 "accelerate", "--out", str(tmp_path / "plain"))
    assert hf.code == 0, hf.stderr  # plain keeps the hf layout: train.py is its trainer


def test_a_litgpt_plan_is_written_as_litgpts_own_run(run_cli: Run, tmp_path: Path) -> None:
    """Full fine-tuning: litgpt resumes it (resume: auto), so the spot plan is written."""
    plan = _with_recipe(tmp_path, "litgpt", method="full", precision="bf16",
                        checkpointing="none")
    done = run_cli("launch", "--plan", str(plan), "--to", "all", "--out", str(tmp_path / "a"),
                   "--json")
    assert done.code == 0, done.stderr
    assert "litgpt.yaml" in done.json()["files"] and "train.py" not in done.json()["files"]
    refused = run_cli("launch", "--plan", str(plan), "--to", "accelerate", "--out",
                      str(tmp_path / "b"))
    assert refused.code == 2 and refused.stderr.count("\n") == 1
    assert "litgpt finetune_full --config litgpt.yaml" in refused.stderr
    assert not (tmp_path / "b").exists()


def test_the_plain_optimizer_in_backward_is_exit_2_in_one_line_for_every_hf_target(
        run_cli: Run, tmp_path: Path) -> None:
    """No HF target steps the optimizer inside backward (only layer-wise GaLore does), so
    each one, and ``all``, refuses the plan rather than train with full gradients."""
    plan = _with_recipe(tmp_path, "hf", method="full", optimizer_in_backward=True, gpus=1,
                        grad_accum=1)
    for to in ("accelerate", "skypilot", "all"):
        out = tmp_path / f"out-{to}"
        refused = run_cli("launch", "--plan", str(plan), "--to", to, "--out", str(out))
        assert refused.code == 2 and refused.stderr.count("\n") == 1, refused.stderr
        assert "--optimizer-in-backward" in refused.stderr and not out.exists()
