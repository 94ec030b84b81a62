"""SkyPilot 0.14.1 itself reads the sky.yaml of the top plans' bundles (tuneplan.service.launch),
offline, with the bundled catalog snapshot: ``Task.from_yaml`` (its schemas, its Resources),
the feature check of the plan's cloud for what the task needs (multi-node, bucket mount,
spot) and the catalog's instance types for the accelerators (``skypilot_venv`` says how).
The cloud table of ``core.launch.targets`` is held to the installed release, and SkyPilot is
shown to refuse what it should (a misspelt field, multi-node on RunPod, an unknown cloud)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.adapters.skypilot_venv import need_skypilot, run_skypilot, sky_home
from tests.adapters.test_launch_names import JOBS
from tuneplan.adapters.importers.snapshot import load_sky_catalog
from tuneplan.core.launch.bundle import LaunchSpec
from tuneplan.core.launch.clouds import bucket_name
from tuneplan.core.launch.targets import (
    SKYPILOT_CATALOG_ONLY,
    SKYPILOT_CLOUDS,
    SkyChoice,
    Storage,
    skypilot_choice,
)

pytestmark = pytest.mark.usefixtures("_have_skypilot")

#: case -> (job in test_launch_names.JOBS, which of its ranked plans: a provider's first,
#: the n-th with a sky.yaml, or the n-th multi-node one with a sky.yaml).
CASES: dict[str, tuple[str, str]] = {
    "8b-qlora-aws": ("8b-qlora", "AWS"), "8b-qlora-runpod": ("8b-qlora", "RunPod"),
    "8b-qlora-lambda": ("8b-qlora", "Lambda"), "8b-qlora-top": ("8b-qlora", "#0"),
    "70b-full-top": ("70b-full", "#0"), "70b-full-multinode": ("70b-full", "nodes#0"),
    "405b-qlora-multinode-0": ("405b-qlora-multinode", "nodes#0"),
    "405b-qlora-multinode-1": ("405b-qlora-multinode", "nodes#1"),
    "8b-qlora-spot-0": ("8b-qlora-spot", "spot#0"), "8b-qlora-spot-1": ("8b-qlora-spot", "spot#1"),
    "8b-qlora-spot-aws": ("8b-qlora-spot", "spot#AWS"),
}


@pytest.fixture(scope="module")
def _have_skypilot() -> None:
    need_skypilot()


def _pick(plans: list[Any], result: Any, which: str) -> tuple[LaunchSpec, dict[str, str]]:
    from tuneplan.service.launch import result_bundle

    multi, _, index = which.partition("#")
    if multi == "spot":  # the n-th plan (or a provider's best) billed at the spot price
        plans = [p for p in plans if p.uses_spot]
        if not index.isdigit():
            multi, index, which = "", "", index
    if not index:  # a provider's best plan
        return result_bundle(next(p for p in plans if p.offer.provider == which), result,
                             ["all"])
    bundles = (result_bundle(p, result, ["all"]) for p in plans
               if multi != "nodes" or p.strategy.nodes > 1)
    with_sky = (b for b in bundles if "sky.yaml" in b[1])
    for _ in range(int(index)):
        next(with_sky)
    return next(with_sky)


@pytest.fixture(scope="module")
def checked(tmp_path_factory: pytest.TempPathFactory, _have_skypilot: None
            ) -> dict[str, tuple[LaunchSpec, dict[str, str], dict[str, Any]]]:
    """Per case: (spec, bundle files, what SkyPilot made of its sky.yaml); one SkyPilot
    process for every case, the negative controls and the cloud table."""
    from tuneplan.adapters.plans import plan

    root = tmp_path_factory.mktemp("sky")
    results = {job: plan(JOBS[job]) for job in {job for job, _ in CASES.values()}}
    bundles: dict[str, tuple[LaunchSpec, dict[str, str]]] = {}
    paths: dict[str, Path] = {}
    for case, (job, which) in CASES.items():
        spec, files = _pick(results[job].plans, results[job], which)
        bundles[case] = spec, files
        paths[case] = _write(root / case, files["sky.yaml"])
    for case, text in _controls(bundles).items():
        paths[case] = _write(root / case, text)
    clouds = sorted({c.name for c in SKYPILOT_CLOUDS.values()} | set(
        SKYPILOT_CATALOG_ONLY.values()))
    got = run_skypilot(sky_home(root / "home"), paths, clouds)
    out = {case: (*bundles[case], got["cases"][case]) for case in CASES}
    out["controls"] = (bundles["8b-qlora-aws"][0], {}, {
        c: got["cases"][c] for c in paths if c not in CASES})
    out["clouds"] = (bundles["8b-qlora-aws"][0], {}, got["clouds"])
    return out


def _write(folder: Path, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sky.yaml").write_text(text)
    return folder / "sky.yaml"


def _controls(bundles: dict[str, tuple[LaunchSpec, dict[str, str]]]) -> dict[str, str]:
    """sky.yaml files SkyPilot must refuse, each one change away from an emitted one."""
    aws = yaml.safe_load(bundles["8b-qlora-aws"][1]["sky.yaml"])
    pod = yaml.safe_load(bundles["8b-qlora-runpod"][1]["sky.yaml"])
    return {
        "misspelt-field": yaml.safe_dump(aws | {"resources": aws["resources"] | {
            "use_spots": False}}),
        "runpod-two-nodes": yaml.safe_dump(pod | {"num_nodes": 2}),
        "unknown-accelerator": yaml.safe_dump(aws | {"resources": aws["resources"] | {
            "accelerators": "L40X:1"}}),
        "catalog-only-cloud": yaml.safe_dump(pod | {"resources": pod["resources"] | {
            "infra": "lium"}}),
    }


@pytest.mark.parametrize("case", list(CASES))
def test_skypilot_loads_the_task_and_its_cloud_can_run_it(
        case: str, checked: dict[str, tuple[LaunchSpec, dict[str, str], dict[str, Any]]]
        ) -> None:
    spec, files, got = checked[case]
    choice = skypilot_choice(spec, load_sky_catalog())
    assert isinstance(choice, SkyChoice)
    assert "error" not in got, got.get("error")
    s = spec.strategy
    if case.endswith(("-aws", "-runpod", "-lambda")):
        assert spec.offer.provider.lower() == case.rsplit("-", 1)[1]
    if "multinode" in case:
        assert s.nodes > 1
    if "-spot-" in case:
        assert spec.use_spot
        if case.endswith("-aws"):
            assert spec.offer.provider == "AWS"
    assert got["cloud"] == choice.cloud.name
    assert got["num_nodes"] == s.nodes
    assert got["accelerators"] == {choice.accelerator: s.gpus}
    assert got["use_spot"] is spec.use_spot
    assert (got["instance_type"], got["region"]) == (None, None)  # only the cloud is pinned
    # What the task asks of the cloud, and the cloud's own feature check passing.
    wanted = {"multi-node"} if s.nodes > 1 else set()
    if choice.storage is Storage.BUCKET_MOUNT:
        wanted.add("storage_mounting")
    if spec.use_spot:
        wanted.add("spot_instance")
    if choice.network_best:
        wanted.add("custom_network_tier")
    assert set(got["features"]) == wanted
    assert got["unsupported"] is None
    # SkyPilot's catalog resolves the accelerators to instance types, the planned one among
    # them where the snapshot lists it.
    assert got["feasible"], got["hint"]
    if choice.instance_listed:
        assert spec.offer.instance_type in got["feasible"]
    assert got["network_tier"] == ("best" if choice.network_best else None)
    assert 143 in got["job_recovery"]["recover_on_exit_codes"]
    assert got["job_recovery"]["strategy"] == "EAGER_NEXT_REGION"
    if choice.storage is Storage.BUCKET_MOUNT:
        (mount,) = got["storage_mounts"].values()
        assert mount["name"] == bucket_name(spec) and mount["mode"] == "MOUNT"
        store = choice.cloud.store
        assert mount["stores"] == ([store.upper()] if store else [])
    else:
        assert got["storage_mounts"] == {} and "checkpoint_store.sh" in files
    assert got["envs"]["TUNEPLAN_CHECKPOINT_DIR"] == "/checkpoints"
    # HF_TOKEN has no value in the file: SkyPilot takes it as a launch-time reference (the
    # sync keys are empty strings that RUN.md's ``--secret NAME`` replaces).
    assert got["secret_refs"] == ["HF_TOKEN"]
    sync_keys = ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"]
    assert got["secrets"] == (sync_keys if choice.storage is Storage.LOCAL_SYNC else [])


def test_skypilot_refuses_what_it_should(
        checked: dict[str, tuple[LaunchSpec, dict[str, str], dict[str, Any]]]) -> None:
    """The same calls fail on a task one change away from an emitted one: the checks are
    real."""
    got = checked["controls"][2]
    assert "use_spots" in got["misspelt-field"]["error"]
    assert "multi-node" in got["runpod-two-nodes"]["unsupported"]
    assert "infra" in got["catalog-only-cloud"]["error"]
    unknown = got["unknown-accelerator"]
    assert "error" in unknown or unknown["feasible"] == [], unknown


def test_the_cloud_table_is_skypilots_own(
        checked: dict[str, tuple[LaunchSpec, dict[str, str], dict[str, Any]]]) -> None:
    """Every SkyPilot cloud a bundle names exists in the installed release with the features
    ``SKYPILOT_CLOUDS`` says (multi-node, bucket mounts, spot); the catalog-only ones do not
    exist there."""
    clouds = checked["clouds"][2]
    for provider, cloud in SKYPILOT_CLOUDS.items():
        assert clouds[cloud.name] == {"canonical": cloud.name, "multi_node": cloud.multi_node,
                                      "mount": cloud.mount, "spot": cloud.spot}, provider
    for provider, name in SKYPILOT_CATALOG_ONLY.items():
        assert "error" in clouds[name], provider
