"""Launch bundles name what the tools accept: SkyPilot accelerator and cloud names from its
catalog (the bundled snapshot), dstack backends and gpuhunt GPU names from the installed
packages, and checkpoint storage each tool can provide on that cloud (train.py resumes every
rank from the checkpoint process 0 picks, so several nodes need one shared folder)."""

from __future__ import annotations

import ast
import csv
import importlib
import io
import json
import os
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.waiting import HANG_GUARD_S
from tuneplan.adapters.bundled import SNAPSHOT_DIR, list_snapshot_files, read_data_text
from tuneplan.adapters.importers.snapshot import load_sky_catalog
from tuneplan.core.catalog.offers import Offer
from tuneplan.core.catalog.providers import selling_provider
from tuneplan.core.job.methods import Method
from tuneplan.core.job.strategy import Job, Strategy
from tuneplan.core.launch import targets
from tuneplan.core.launch.bundle import LaunchSpec, bundle_files, expand_targets, launch_spec
from tuneplan.core.launch.clouds import STORE_SCRIPT, store_script
from tuneplan.core.launch.targets import (
    DSTACK_BACKENDS,
    DSTACK_INSTANCE_VOLUME_BACKENDS,
    DSTACK_MULTINODE_BACKENDS,
    DSTACK_REGISTER_ONLY_VOLUME_BACKENDS,
    DSTACK_VOLUME_BACKENDS,
    GPUHUNT_NAMES,
    ROCM_IMAGE,
    SKYPILOT_CATALOG_ONLY,
    SKYPILOT_CLOUDS,
    DstackChoice,
    Refusal,
    SkyChoice,
    Storage,
    dstack_choice,
    skypilot_choice,
)
from tuneplan.errors import InvalidValueError

SCHEMAS = Path(__file__).parent.parent / "fixtures" / "launch" / "skypilot_0.14.1_schemas.json"
DSTACK_SRC = Path(__import__("importlib.util").util.find_spec("dstack").origin).parent \
    if __import__("importlib.util").util.find_spec("dstack") else None


def _snapshot_names() -> dict[str, set[str]]:
    """AcceleratorName values per SkyPilot cloud, read straight from the CSVs (not through
    the adapter under test)."""
    out: dict[str, set[str]] = {}
    for name in list_snapshot_files():
        cloud = name.removesuffix(".csv").removesuffix("_v7")
        rows = csv.DictReader(io.StringIO(read_data_text(SNAPSHOT_DIR, name)))
        out.setdefault(cloud, set()).update(
            r["AcceleratorName"].strip() for r in rows if (r.get("AcceleratorName") or "").strip())
    return out


SNAPSHOT_NAMES = _snapshot_names()


def _gpuhunt_known() -> set[tuple[str, int]]:
    gpuhunt = pytest.importorskip("gpuhunt")
    return {(g.name, g.memory) for g in (*gpuhunt.KNOWN_NVIDIA_GPUS, *gpuhunt.KNOWN_AMD_GPUS)}


def _spec(offer: Offer, *, nodes: int = 1, spot: bool = False) -> LaunchSpec:
    """A cheap LaunchSpec for an offer: the default strategy on all its GPUs."""
    return LaunchSpec(
        plan_id="0123456789ab", model_id="m", strategy=Strategy(gpus=offer.gpu_count,
                                                                 nodes=nodes),
        offer=offer, use_spot=spot, step_s=1.0, checkpoint_interval_s=1800.0,
        interval_source="test", save_steps=100, save_total_limit=2, checkpoint_bytes=10**9,
        disk_bytes=200 * 10**9, total_params=10**9, trainable_params=10**7,
        tokens_per_epoch=None, epochs=1.0, hours=2.0, on_demand_usd=None, spot_usd=None,
        why=(), warnings=())


@pytest.fixture(scope="module")
def offers(tmp_path_factory: pytest.TempPathFactory) -> list[Offer]:
    from tuneplan.adapters.store import load_catalog

    found = load_catalog(path=tmp_path_factory.mktemp("catalog") / "catalog.sqlite")
    assert len(found) > 4000
    return found


def _pairs(offers: list[Offer]) -> dict[tuple[str, str], Offer]:
    """One offer per (provider, GPU): the first one the catalog lists."""
    out: dict[tuple[str, str], Offer] = {}
    for offer in offers:
        out.setdefault((offer.provider, offer.gpu), offer)
    return out


# ------------------------------------------------------------------ every GPU x cloud
def test_every_catalog_gpu_and_cloud_gets_a_skypilot_name_its_catalog_lists(
        offers: list[Offer]) -> None:
    catalog = load_sky_catalog()
    pairs = _pairs(offers)
    assert len(pairs) > 150
    for (provider, gpu), offer in pairs.items():
        choice = skypilot_choice(_spec(offer), catalog)
        cloud = offer.source.removeprefix("skypilot-snapshot/").removesuffix("-v7")
        if selling_provider(provider) in SKYPILOT_CATALOG_ONLY:  # no cloud in the release
            assert isinstance(choice, Refusal) and "has no" in choice.reason, provider
            continue
        if isinstance(choice, Refusal):  # every offer here comes from the snapshot itself
            pytest.fail(f"{provider} {gpu}: {choice.reason}")
        assert choice.cloud.name == cloud, provider
        assert choice.accelerator in SNAPSHOT_NAMES[cloud], (provider, gpu, choice.accelerator)
        assert catalog.lists(cloud, gpu, choice.accelerator)


def test_the_named_examples() -> None:
    catalog = load_sky_catalog()
    assert catalog.accelerator("runpod", "RTX 6000 Ada") == "RTX6000-Ada"
    assert catalog.accelerator("vast", "RTX 6000 Ada") == "RTX6000-Ada"
    assert catalog.accelerator("aws", "A100 80GB SXM4") == "A100-80GB"
    assert catalog.accelerator("lambda", "RTX A6000") == "A6000"
    assert catalog.accelerator("aws", "RTX 6000 Ada") is None  # AWS lists none
    # An instance type's own row wins over the cloud's most common name.
    assert catalog.accelerator("gcp", "H100 SXM5") == "H100"
    assert catalog.accelerator("gcp", "H100 SXM5", "a3-megagpu-8g") in {"H100", "H100-MEGA"}


def test_every_snapshot_cloud_has_its_skypilot_spelling() -> None:
    from tuneplan.core.catalog.providers import normalise_provider_name

    spelled = {normalise_provider_name(name.removesuffix(".csv").removesuffix("_v7")):
               name.removesuffix(".csv").removesuffix("_v7") for name in list_snapshot_files()}
    for provider, cloud in spelled.items():
        # A catalog folder without a cloud in the released client (it refuses the name).
        named = SKYPILOT_CATALOG_ONLY.get(provider) or SKYPILOT_CLOUDS[provider].name
        assert named == cloud
    assert not SKYPILOT_CATALOG_ONLY.keys() & SKYPILOT_CLOUDS.keys()
    assert SKYPILOT_CLOUDS["Oracle (OCI)"].name == "oci"
    assert SKYPILOT_CLOUDS["Verda (ex-DataCrunch)"].name == "verda"


def test_a_resold_offer_launches_on_its_resellers_cloud(offers: list[Offer]) -> None:
    assert targets.skypilot_cloud("Scaleway (via Shadeform)") is targets.SKYPILOT_CLOUDS[
        "Shadeform"]
    assert targets.dstack_backend("Lambda (via Shadeform)") is None  # no shadeform backend
    assert targets.dstack_backend("Lambda") == "lambda"
    resold = next(o for o in offers if o.provider == "Scaleway (via Shadeform)"
                  and o.instance_type == "scaleway_H100")
    choice = targets.skypilot_choice(_spec(resold), load_sky_catalog())
    assert isinstance(choice, targets.SkyChoice)
    assert (choice.cloud.name, choice.accelerator, choice.instance_listed) == (
        "shadeform", "H100", True)


def test_every_catalog_gpu_gets_a_gpuhunt_name_or_a_refusal(offers: list[Offer]) -> None:
    known = _gpuhunt_known()
    names = {name for name, _ in known}
    refused: set[str] = set()
    for (_, gpu), offer in _pairs(offers).items():
        choice = dstack_choice(_spec(offer))
        if isinstance(choice, Refusal):
            assert "gpuhunt" in choice.reason
            refused.add(gpu)
            continue
        name, _, memory = choice.gpu.partition(":")
        assert name in names, gpu
        if memory:
            assert (name, int(memory.removesuffix("GB"))) in known, gpu
    # Cards gpuhunt has no entry for (gpuhunt constraints.py KNOWN_*_GPUS).
    assert refused == {"T4G", "K80", "M60", "P4", "A30", "A800 80GB PCIe",
                       "Radeon Instinct MI25", "RTX A2000"}
    for gpu, (name, memory) in GPUHUNT_NAMES.items():
        assert (name, memory) in known if memory else name in names, gpu


def test_every_gpu_gpuhunt_knows_is_named_back_as_gpuhunt_names_it() -> None:
    """The way back: each (name, memory) of gpuhunt's known GPUs that the alias table maps to
    a card of ours gets exactly that gpuhunt name (with the memory where the name alone is
    ambiguous) in dstack's files; AMD cards among them get the ROCm image."""
    constraints = pytest.importorskip("gpuhunt._internal.constraints")
    from collections import Counter

    from tuneplan.adapters.bundled import load_gpu_spec
    from tuneplan.core.catalog.gpu_names import UnknownGpuError, normalise_gpu_name

    known = [*constraints.KNOWN_NVIDIA_GPUS, *constraints.KNOWN_AMD_GPUS]
    repeated = Counter(info.name for info in known)
    checked = 0
    for info in known:
        try:
            gpu = normalise_gpu_name(info.name, info.memory * 2**30)
        except UnknownGpuError:
            continue
        want = info.name if repeated[info.name] == 1 else f"{info.name}:{info.memory}GB"
        got = targets.dstack_gpu(gpu)
        assert got is not None and got.split(":")[0] == info.name, gpu
        if repeated[info.name] > 1:
            assert got == want, gpu
        assert (gpu in targets.AMD_GPUS) is (load_gpu_spec(gpu).vendor == "AMD"), gpu
        checked += 1
    assert checked >= 75


def test_dstack_tables_are_dstacks_own() -> None:
    if DSTACK_SRC is None:
        pytest.skip("dstack not installed")
    from dstack._internal.core.models.backends.base import BackendType

    values = {b.value for b in BackendType}
    assert set(DSTACK_BACKENDS.values()) <= values
    backends = DSTACK_SRC / "_internal" / "core" / "backends"

    def implementing(feature: str) -> set[str]:
        """Backends whose Compute class lists ``feature`` among its bases."""
        out = set()
        for compute in backends.glob("*/compute.py"):
            for node in ast.walk(ast.parse(compute.read_text())):
                if isinstance(node, ast.ClassDef) and any(
                        isinstance(b, ast.Name) and b.id == feature for b in node.bases):
                    out.add(compute.parent.name)
        if "digitalocean_base" in out:  # its two backends subclass it
            out |= {"digitalocean", "amddevcloud"}
        return {"lambda" if b == "lambdalabs" else b for b in out} - {"base",
                                                                      "digitalocean_base"}

    assert implementing("ComputeWithVolumeSupport") == (
        DSTACK_VOLUME_BACKENDS | DSTACK_REGISTER_ONLY_VOLUME_BACKENDS)
    assert implementing("ComputeWithMultinodeSupport") == DSTACK_MULTINODE_BACKENDS
    assert implementing("ComputeWithInstanceVolumesSupport") == DSTACK_INSTANCE_VOLUME_BACKENDS


# ------------------------------------------------------------------ storage per cloud
def _offer(offers: list[Offer], provider: str, gpu: str | None = None) -> Offer:
    return next(o for o in offers if o.provider == provider and (gpu is None or o.gpu == gpu))


def test_bucket_mount_only_where_skypilot_mounts(offers: list[Offer]) -> None:
    catalog = load_sky_catalog()
    aws = skypilot_choice(_spec(_offer(offers, "AWS")), catalog)
    runpod = skypilot_choice(_spec(_offer(offers, "RunPod")), catalog)
    assert isinstance(aws, SkyChoice) and aws.storage is Storage.BUCKET_MOUNT
    assert isinstance(runpod, SkyChoice) and runpod.storage is Storage.LOCAL_SYNC
    for provider in ("Vast.ai", "Hyperbolic", "Verda (ex-DataCrunch)", "Seeweb"):
        got = skypilot_choice(_spec(_offer(offers, provider)), catalog)
        assert isinstance(got, SkyChoice) and got.storage is Storage.LOCAL_SYNC, provider
    files = bundle_files(_spec(_offer(offers, "RunPod")), expand_targets(["skypilot"]),
                         train_script="", sky_catalog=catalog)
    task = yaml.safe_load(files["sky.yaml"])
    assert "file_mounts" not in task and STORE_SCRIPT in files
    assert task["envs"]["TUNEPLAN_SYNC_URL"] == "" and "AWS_ACCESS_KEY_ID" in task["secrets"]
    assert "bash checkpoint_store.sh pull || exit 2" in task["run"]
    assert "cannot mount a bucket on runpod" in files["RUN.md"]
    on_aws = yaml.safe_load(bundle_files(_spec(_offer(offers, "AWS")), expand_targets(
        ["skypilot"]), train_script="", sky_catalog=catalog)["sky.yaml"])
    assert on_aws["file_mounts"]["/checkpoints"] == {
        "name": "tuneplan-ckpt-0123456789ab", "store": "s3", "mode": "MOUNT"}
    assert on_aws["secrets"] == {"HF_TOKEN": None}
    assert on_aws["resources"]["infra"] == "aws" and "instance_type" not in on_aws["resources"]
    assert "region" not in on_aws["resources"]


def test_multi_node_needs_one_shared_location(offers: list[Offer],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    catalog = load_sky_catalog()
    # A multi-node cloud with no bucket mount (none in SkyPilot 0.14.1's list: Hyperstack, the
    # one the catalog has, is no cloud of that release) is refused for want of a shared folder.
    hyperstack = skypilot_choice(_spec(_offer(offers, "Hyperstack"), nodes=2), catalog)
    assert isinstance(hyperstack, Refusal) and "has no hyperstack cloud" in hyperstack.reason
    unmounted = {**SKYPILOT_CLOUDS, "Lambda": replace(SKYPILOT_CLOUDS["Lambda"], mount=False)}
    monkeypatch.setattr(targets, "SKYPILOT_CLOUDS", unmounted)
    lam = skypilot_choice(_spec(_offer(offers, "Lambda"), nodes=2), catalog)
    assert isinstance(lam, Refusal) and "shared checkpoint" in lam.reason
    monkeypatch.undo()
    runpod = skypilot_choice(_spec(_offer(offers, "RunPod"), nodes=2), catalog)
    assert isinstance(runpod, Refusal) and "multi-node" in runpod.reason
    aws8 = next(o for o in offers if o.provider == "AWS" and o.gpu_count == 8
                and o.gpu == "H100 SXM5")
    best = skypilot_choice(_spec(aws8, nodes=2), catalog)
    assert isinstance(best, SkyChoice) and best.network_best
    assert best.storage is Storage.BUCKET_MOUNT
    # dstack: RunPod's one volume is mounted by every node; no per-node volume names.
    pod = dstack_choice(_spec(_offer(offers, "RunPod"), nodes=2))
    assert isinstance(pod, DstackChoice) and pod.storage is Storage.NETWORK_VOLUME
    files = bundle_files(_spec(_offer(offers, "RunPod"), nodes=2), expand_targets(["dstack"]),
                         train_script="")
    assert "node_rank" not in files[".dstack.yml"] and "volume.dstack.yml" in files
    nebius = dstack_choice(_spec(_offer(offers, "Nebius"), nodes=2))
    assert isinstance(nebius, DstackChoice) and nebius.storage is Storage.SHARED_HOST_PATH
    lam = dstack_choice(_spec(_offer(offers, "Lambda"), nodes=2))
    assert isinstance(lam, Refusal) and "multi-node" in lam.reason


def test_dstack_volume_uses_the_offers_own_backend_and_region(offers: list[Offer]) -> None:
    pod = _offer(offers, "RunPod")
    files = bundle_files(_spec(pod), expand_targets(["dstack"]), train_script="")
    volume = yaml.safe_load(files["volume.dstack.yml"])
    assert (volume["backend"], volume["region"]) == ("runpod", pod.zone or pod.region)
    for provider in ("Lambda", "Oracle (OCI)", "Nebius", "Verda (ex-DataCrunch)", "Vast.ai"):
        files = bundle_files(_spec(_offer(offers, provider)), expand_targets(["dstack"]),
                             train_script="")
        assert "volume.dstack.yml" not in files, provider  # no network volumes there
        assert STORE_SCRIPT in files and "volumes" not in yaml.safe_load(files[".dstack.yml"])


def test_amd_gpus_get_a_rocm_image(offers: list[Offer]) -> None:
    amd = _offer(offers, "RunPod", "MI300X")
    task = yaml.safe_load(bundle_files(_spec(amd), expand_targets(["dstack"]),
                                       train_script="")[".dstack.yml"])
    assert task["image"] == ROCM_IMAGE and "python" not in task
    assert task["resources"]["gpu"].startswith("MI300X:")


def test_a_refused_target_is_an_error_alone_and_a_reason_under_all(offers: list[Offer]) -> None:
    spec = _spec(_offer(offers, "RunPod"), nodes=2)
    with pytest.raises(InvalidValueError, match="skypilot cannot launch"):
        bundle_files(spec, expand_targets(["skypilot"]), train_script="",
                     sky_catalog=load_sky_catalog())
    files = bundle_files(spec, expand_targets(["all"]), train_script="",
                         sky_catalog=load_sky_catalog(), strict=False)
    assert "sky.yaml" not in files and ".dstack.yml" in files
    assert "SkyPilot: no files written: SkyPilot does not run multi-node" in files["RUN.md"]
    other = replace(_offer(offers, "AWS"), provider="CoreWeave")
    assert isinstance(skypilot_choice(_spec(other), load_sky_catalog()), Refusal)


# ------------------------------------------------------------------ checkpoint_store.sh
def _store(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    stubs = tmp_path / "bin"
    stubs.mkdir(exist_ok=True)
    (stubs / "aws").write_text(f'#!/bin/sh\necho "$@" >> {tmp_path}/aws.log\n')
    (stubs / "aws").chmod(0o755)
    (tmp_path / STORE_SCRIPT).write_text(store_script(_spec_stub()))
    full = {**os.environ, "PATH": f"{stubs}:{os.environ['PATH']}",
            "TUNEPLAN_CHECKPOINT_DIR": str(tmp_path / "ckpt"), **env}
    return subprocess.run(["bash", STORE_SCRIPT, *args], cwd=tmp_path, env=full,
                          capture_output=True, text=True, check=False,
                          timeout=HANG_GUARD_S)


def _spec_stub() -> LaunchSpec:
    from datetime import UTC, datetime
    from decimal import Decimal

    offer = Offer(provider="RunPod", instance_type="1x_L40S_SECURE", gpu="L40S", gpu_count=1,
                  gpu_memory_bytes=48 * 2**30, vcpus=None, ram_bytes=None, region="US",
                  price_per_hour=Decimal(1), fetched_at=datetime(2026, 1, 1, tzinfo=UTC),
                  source="test")
    return _spec(offer)


def test_store_script_refuses_a_spot_run_without_a_sync_url(tmp_path: Path) -> None:
    done = _store(tmp_path, "pull", TUNEPLAN_SYNC_REQUIRED="1", TUNEPLAN_SYNC_URL="")
    assert done.returncode == 2 and "TUNEPLAN_SYNC_URL is not set" in done.stderr
    assert _store(tmp_path, "pull", TUNEPLAN_SYNC_REQUIRED="0").returncode == 0


def test_store_script_pulls_then_pushes_after_the_sigterm_save(tmp_path: Path) -> None:
    url = "s3://bucket/run"
    assert _store(tmp_path, "pull", TUNEPLAN_SYNC_URL=url).returncode == 0
    flag = tmp_path / "flag"
    proc = subprocess.Popen(
        ["bash", STORE_SCRIPT, "loop"], cwd=tmp_path, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}",
             "TUNEPLAN_CHECKPOINT_DIR": str(tmp_path / "ckpt"), "TUNEPLAN_SYNC_URL": url,
             "TUNEPLAN_SYNC_EVERY_S": "30", "TUNEPLAN_PREEMPTED_FILE": str(flag)})
    from tests.waiting import wait_until

    def sleeping() -> bool:  # the loop's `sleep` runs: it is waiting between pushes
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                name, rest = stat.read_text().rsplit(")", 1)
            except OSError:
                continue
            if name.endswith("(sleep") and rest.split()[1] == str(proc.pid):
                return True
        return False

    wait_until(sleeping, "the store loop to start sleeping")
    # train.py saved on SIGTERM: the loop (which the task starts with SIGTERM ignored) ends
    # on the flag, with its last push, not on the signal
    flag.write_text("{}")
    assert proc.wait(timeout=HANG_GUARD_S) == 0
    calls = (tmp_path / "aws.log").read_text().splitlines()
    ckpt = tmp_path / "ckpt"
    assert calls == [f"s3 sync {url} {ckpt} --only-show-errors",
                     f"s3 sync {ckpt} {url} --delete --only-show-errors"]


def test_store_script_stops_a_multi_node_run_on_an_unshared_folder(tmp_path: Path) -> None:
    done = _store(tmp_path, "shared", "0", "2", TUNEPLAN_SHARED_WAIT_S="1")
    assert done.returncode == 2 and "is not shared by all 2 nodes" in done.stderr
    (tmp_path / "ckpt" / ".tuneplan_nodes" / "1").write_text("other")  # node 1 wrote too
    assert _store(tmp_path, "shared", "0", "2", TUNEPLAN_SHARED_WAIT_S="1").returncode == 0


# ------------------------------------------------------------------ top plans, real parsers
JOBS = {
    "8b-qlora": Job(model="meta-llama/Llama-3.1-8B", strategy=Strategy(method=Method.QLORA),
                    tokens=50_000_000),
    "70b-full": Job(model="meta-llama/Llama-3.1-70B", strategy=Strategy(method=Method.FULL),
                    tokens=2_000_000_000, multi_node=True, max_gpus=32),
    "405b-qlora-multinode": Job(model="meta-llama/Llama-3.1-405B",
                                strategy=Strategy(method=Method.QLORA), tokens=50_000_000,
                                multi_node=True),
    "8b-qlora-spot": Job(model="meta-llama/Llama-3.1-8B", strategy=Strategy(method=Method.QLORA),
                         tokens=50_000_000, spot=True),
}


@pytest.fixture(scope="module")
def top_plans() -> dict[str, list[Any]]:
    from tuneplan.adapters.plans import plan
    from tuneplan.core.planner.record import saved_plan

    out = {}
    for name, job in JOBS.items():
        result = plan(job)
        chosen = result.plans[:5]
        if name.endswith("multinode"):
            chosen = [p for p in result.plans if p.strategy.nodes > 1][:5]
        assert len(chosen) == 5, name
        out[name] = [saved_plan(p, result) for p in chosen]
    return out


CASES = [(name, i) for name in JOBS for i in range(5)]


@pytest.mark.parametrize(("job", "index"), CASES, ids=[f"{n}-{i}" for n, i in CASES])
def test_top_plans_name_what_the_tools_accept(job: str, index: int,
                                              top_plans: dict[str, list[Any]]) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    pytest.importorskip("dstack")
    from dstack._internal.core.models.configurations import (
        TaskConfiguration,
        parse_apply_configuration,
        parse_run_configuration,
    )
    from dstack._internal.core.models.fleets import FleetConfiguration

    saved = top_plans[job][index]
    spec = launch_spec(saved)
    catalog = load_sky_catalog()
    files = bundle_files(spec, expand_targets(["all"]), train_script="", sky_catalog=catalog,
                         strict=False)
    if job.endswith("multinode"):
        assert spec.strategy.nodes > 1
    schemas = json.loads(SCHEMAS.read_text())
    sky = skypilot_choice(spec, catalog)
    if isinstance(sky, Refusal):
        assert "sky.yaml" not in files and sky.reason in files["RUN.md"].replace("\\", "")
    else:
        task = yaml.safe_load(files["sky.yaml"])
        jsonschema.validate(task, schemas["task"])
        jsonschema.validate(task["resources"], schemas["resources"])  # "task" takes any object
        name, count = task["resources"]["accelerators"].split(":")
        assert name in SNAPSHOT_NAMES[task["resources"]["infra"]]
        assert int(count) == spec.strategy.gpus
        for mount in (task.get("file_mounts") or {}).values():
            jsonschema.validate(mount, schemas["storage"])
            cloud = targets.skypilot_cloud(spec.offer.provider)  # a resold offer: its reseller
            assert cloud is not None and cloud.mount  # MOUNT only where it mounts
        assert task["num_nodes"] == spec.strategy.nodes
    dst = dstack_choice(spec)
    if isinstance(dst, Refusal):
        assert ".dstack.yml" not in files
        return
    known = {n for n, _ in _gpuhunt_known()}
    run = parse_run_configuration(yaml.safe_load(files[".dstack.yml"]))
    assert isinstance(run, TaskConfiguration) and run.nodes == spec.strategy.nodes
    assert run.resources.gpu.name == [dst.gpu.split(":")[0]] and dst.gpu.split(":")[0] in known
    # NCCL's shared memory: 8 GB a GPU, not Docker's 64 MB (dstack parses it as a Memory)
    assert run.resources.shm_size == 8 * spec.strategy.gpus
    fleet = parse_apply_configuration(yaml.safe_load(files["fleet.dstack.yml"]))
    assert isinstance(fleet, FleetConfiguration) and fleet.nodes.min == spec.strategy.nodes
    if spec.strategy.nodes > 1:
        assert fleet.placement.value == "cluster"
    if "volume.dstack.yml" in files:
        volume = parse_apply_configuration(yaml.safe_load(files["volume.dstack.yml"]))
        assert volume.type == "volume"
        assert volume.backend.value == DSTACK_BACKENDS[spec.offer.provider]
        assert [v.name for v in run.volumes] == [volume.name]  # one volume, every node
    if (run.backends or []) and spec.offer.provider in DSTACK_BACKENDS:
        assert [b.value for b in run.backends] == [DSTACK_BACKENDS[spec.offer.provider]]
    dstack_server_accepts(files)


def dstack_server_accepts(files: dict[str, str]) -> None:
    """What dstack's server checks when the files are applied (dstack 0.22.5,
    ``server/services/runs/spec.py: validate_run_spec_and_set_defaults``,
    ``fleets.py: _validate_fleet_spec_and_set_defaults``, ``volumes.py:
    _validate_volume_configuration``: names, volume paths, GPU vendor vs image, fleet
    subtype fields, volume backends with volume support); raises what the server would."""
    pytest.importorskip("sqlalchemy")  # dstack's server extra
    from dstack._internal.core.models.configurations import (
        parse_apply_configuration,
        parse_run_configuration,
    )
    from dstack._internal.core.models.fleets import FleetSpec
    from dstack._internal.core.models.profiles import Profile
    from dstack._internal.core.models.runs import RunSpec
    from dstack._internal.server.models import UserModel

    # In this order: dstack's server modules import each other in a cycle that only this
    # order (the one its own app follows: runs before fleets) resolves.
    run_rules = importlib.import_module("dstack._internal.server.services.runs.spec")
    fleet_rules = importlib.import_module("dstack._internal.server.services.fleets")
    volume_rules = importlib.import_module("dstack._internal.server.services.volumes")

    run = parse_run_configuration(yaml.safe_load(files[".dstack.yml"]))
    run_rules.validate_run_spec_and_set_defaults(
        UserModel(name="tuneplan-test", ssh_public_key="ssh-ed25519 AAAAtest"),
        RunSpec(run_name=run.name, configuration=run, profile=Profile(name="default")))
    fleet = parse_apply_configuration(yaml.safe_load(files["fleet.dstack.yml"]))
    fleet_rules._validate_fleet_spec_and_set_defaults(
        FleetSpec(configuration=fleet, profile=Profile(name="default")))
    if "volume.dstack.yml" in files:
        volume_rules._validate_volume_configuration(
            parse_apply_configuration(yaml.safe_load(files["volume.dstack.yml"])))


def test_dstack_server_refuses_what_it_should(top_plans: dict[str, list[Any]]) -> None:
    """The server-side checks above can fail: each control is one change away from an
    emitted bundle (a volume with neither size nor id, an AMD GPU without an image, a fleet
    with both nodes and an SSH host list)."""
    pytest.importorskip("sqlalchemy")
    from dstack._internal.core.errors import ServerClientError

    saved = next(p for p in top_plans["8b-qlora"] if "volume" in _dstack_files(p))
    files = _dstack_files(saved)
    dstack_server_accepts(files)
    volume, run, fleet = (yaml.safe_load(files[n]) for n in
                          ("volume.dstack.yml", ".dstack.yml", "fleet.dstack.yml"))
    controls = {
        "volume without size": {"volume.dstack.yml": {k: v for k, v in volume.items()
                                                      if k != "size"}},
        "amd without image": {".dstack.yml": {k: v for k, v in run.items() if k != "image"}
                              | {"resources": run["resources"] | {"gpu": "MI300X:1"}}},
        "fleet nodes and ssh": {"fleet.dstack.yml": fleet | {"ssh_config": {
            "user": "ubuntu", "identity_file": "~/.ssh/id_rsa", "hosts": ["10.0.0.1"]}}},
    }
    for name, change in controls.items():
        bad = files | {k: yaml.safe_dump(v) for k, v in change.items()}
        with pytest.raises(ServerClientError):
            dstack_server_accepts(bad)
            pytest.fail(f"dstack's server took the control {name!r}")


def _dstack_files(saved: Any) -> dict[str, str]:
    files = bundle_files(launch_spec(saved), expand_targets(["dstack"]), train_script="",
                         strict=False)
    return files | {"volume": ""} if "volume.dstack.yml" in files else files
