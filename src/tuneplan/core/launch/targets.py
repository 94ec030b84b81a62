"""What SkyPilot and dstack accept for one offer: their cloud/backend and GPU names, and where
checkpoints can live so that a restarted (or multi-node) run resumes from the same step.

Pure tables and rules. The SkyPilot a bundle targets is ``SKYPILOT_VERSION`` (the release
whose schemas the tests vendor and whose client they install beside the project). Its
accelerator names come from its own catalog (the bundled snapshot, read by an adapter into a
``SkyCatalog``); its clouds from its registry (``sky.utils.registry.CLOUD_REGISTRY``) and
their features from ``check_features_are_supported`` in ``sky/clouds/<cloud>.py`` of
skypilot 0.14.1 (``Task.get_required_cloud_features`` asks MULTI_NODE for ``num_nodes > 1``
and STORAGE_MOUNTING for MOUNT-mode stores, ``Resources`` asks SPOT_INSTANCE for ``use_spot``
and CUSTOM_NETWORK_TIER for ``network_tier: best``); dstack's backend and
volume support from dstack 0.22.5 (``core/backends/*/compute.py``: ``ComputeWithVolumeSupport``,
``ComputeWithMultinodeSupport``, ``ComputeWithInstanceVolumesSupport``); GPU names as
gpuhunt's ``KNOWN_NVIDIA_GPUS`` / ``KNOWN_AMD_GPUS`` spell them. Tests hold each table to its
source (the snapshot, dstack's and gpuhunt's installed packages).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from tuneplan.core.catalog.providers import normalise_provider_name, selling_provider
from tuneplan.core.launch.bundle import LaunchSpec


# ------------------------------------------------------------------------------ SkyPilot
@dataclass(frozen=True, slots=True)
class SkyCatalog:
    """SkyPilot's catalog as far as the bundle needs it, per SkyPilot cloud name: the
    AcceleratorName of each canonical GPU (``names``: cloud -> GPU -> {name: rows}), the
    AcceleratorName of each instance type (``instance_names``), and the instance types and
    regions the cloud lists."""

    names: Mapping[str, Mapping[str, Mapping[str, int]]] = field(default_factory=dict)
    instance_names: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    instance_types: Mapping[str, frozenset[str]] = field(default_factory=dict)
    regions: Mapping[str, frozenset[str]] = field(default_factory=dict)

    def accelerator(self, cloud: str, gpu: str, instance_type: str = "") -> str | None:
        """The cloud's name for a canonical GPU: the name of the offer's own instance type
        where the catalog lists it with this GPU, else the one most of the cloud's rows use
        (ties: the first in sort order); None when the cloud lists no such GPU."""
        counts = self.names.get(cloud, {}).get(gpu)
        if not counts:
            return None
        own = self.instance_names.get(cloud, {}).get(instance_type)
        if own in counts:
            return own
        return min(counts, key=lambda name: (-counts[name], name))

    def lists(self, cloud: str, gpu: str, name: str) -> bool:
        return name in self.names.get(cloud, {}).get(gpu, {})


@dataclass(frozen=True, slots=True)
class SkyCloud:
    """What one SkyPilot cloud supports (``CloudImplementationFeatures`` it does not declare
    unsupported). ``network_best``: GPU names for which ``network_tier: best`` is honoured
    (empty: never; ``None``: any)."""

    name: str
    store: str | None  # the bucket store on this cloud; None: SkyPilot picks (mount clouds)
    mount: bool
    multi_node: bool
    spot: bool
    network_best: frozenset[str] | None = frozenset()


def _cloud(name: str, *, mount: bool, multi: bool, spot: bool, store: str | None = None,
           network: frozenset[str] | None = frozenset()) -> SkyCloud:
    return SkyCloud(name=name, store=store, mount=mount, multi_node=multi, spot=spot,
                    network_best=network)


#: The SkyPilot release the bundle's sky.yaml is written for (and checked against).
SKYPILOT_VERSION = "0.14.1"

#: Canonical provider name (``core.catalog.providers``) -> SkyPilot cloud, as the registry
#: of ``SKYPILOT_VERSION`` spells it (the snapshot's file names are the same words).
SKYPILOT_CLOUDS: dict[str, SkyCloud] = {
    "AWS": _cloud("aws", mount=True, multi=True, spot=True, store="s3", network=None),
    "GCP": _cloud("gcp", mount=True, multi=True, spot=True, store="gcs", network=None),
    "Azure": _cloud("azure", mount=True, multi=True, spot=True, store="azure"),
    "Oracle (OCI)": _cloud("oci", mount=True, multi=True, spot=True, store="oci"),
    "Nebius": _cloud("nebius", mount=True, multi=True, spot=True, store="nebius",
                     network=frozenset({"H100", "H200"})),  # only x8 (nebius.py)
    "Lambda": _cloud("lambda", mount=True, multi=True, spot=False),
    "Cudo": _cloud("cudo", mount=True, multi=True, spot=False),
    "Mithril": _cloud("mithril", mount=True, multi=True, spot=True),
    "Prime Intellect": _cloud("primeintellect", mount=True, multi=False, spot=True),
    "RunPod": _cloud("runpod", mount=False, multi=False, spot=True),
    "Vast.ai": _cloud("vast", mount=False, multi=False, spot=True),
    "Verda (ex-DataCrunch)": _cloud("verda", mount=False, multi=False, spot=True),
    "Hyperbolic": _cloud("hyperbolic", mount=False, multi=False, spot=False),
    "Seeweb": _cloud("seeweb", mount=False, multi=False, spot=False),
    "Shadeform": _cloud("shadeform", mount=False, multi=False, spot=False),
    "Yotta": _cloud("yotta", mount=False, multi=False, spot=False),
}
#: Providers whose prices SkyPilot's catalog repository lists (a ``catalogs/v8/<name>``
#: folder, in the bundled snapshot) but for which ``SKYPILOT_VERSION`` has no cloud: its
#: task schema refuses ``infra: <name>``.
SKYPILOT_CATALOG_ONLY: dict[str, str] = {
    "Hyperstack": "hyperstack", "Lium": "lium", "Daytona": "daytona",
    "Jarvislabs": "jarvislabs", "Spheron": "spheron"}


class Storage(StrEnum):
    """Where the run's checkpoints live."""

    BUCKET_MOUNT = "bucket-mount"  # every node writes through the same mounted bucket
    LOCAL_SYNC = "local-sync"      # local disk, pulled at start and pushed periodically
    NETWORK_VOLUME = "network-volume"  # the provider's volume (dstack), one per run
    SHARED_HOST_PATH = "shared-host-path"  # an instance path every node shares (dstack)


@dataclass(frozen=True, slots=True)
class SkyChoice:
    cloud: SkyCloud
    accelerator: str
    storage: Storage
    network_best: bool
    instance_listed: bool
    region_listed: bool


@dataclass(frozen=True, slots=True)
class Refusal:
    """The tool cannot run this offer as planned; ``reason`` says why in one line."""

    tool: str
    reason: str


def skypilot_cloud(provider: str) -> SkyCloud | None:
    """SkyPilot's cloud for an offer's provider; a resold offer is launched on its reseller's
    cloud (``Scaleway (via Shadeform)`` -> ``shadeform``)."""
    return SKYPILOT_CLOUDS.get(normalise_provider_name(selling_provider(provider)))


def skypilot_choice(spec: LaunchSpec, catalog: SkyCatalog) -> SkyChoice | Refusal:
    """SkyPilot's cloud, accelerator name and checkpoint storage for the plan's offer, or
    why SkyPilot cannot launch it as planned."""
    offer, nodes = spec.offer, spec.strategy.nodes
    cloud = skypilot_cloud(offer.provider)
    if cloud is None:
        listed = SKYPILOT_CATALOG_ONLY.get(
            normalise_provider_name(selling_provider(offer.provider)))
        if listed:
            return Refusal("skypilot", f"SkyPilot {SKYPILOT_VERSION} has no {listed} cloud "
                                       "(its catalog repository lists prices for it, the "
                                       "released client cannot launch there)")
        return Refusal("skypilot", f"SkyPilot has no cloud for {offer.provider!r}")
    name = catalog.accelerator(cloud.name, offer.gpu, offer.instance_type)
    if name is None:
        return Refusal("skypilot", f"SkyPilot's catalog (bundled snapshot) lists no "
                                   f"{offer.gpu} on {cloud.name}")
    if nodes > 1 and not cloud.multi_node:
        return Refusal("skypilot", f"SkyPilot does not run multi-node clusters on {cloud.name}"
                                   f" (the plan has {nodes} nodes)")
    if spec.use_spot and not cloud.spot:
        return Refusal("skypilot", f"SkyPilot has no spot instances on {cloud.name}")
    if nodes > 1 and not cloud.mount:
        return Refusal("skypilot", f"{nodes} nodes need one shared checkpoint location and "
                                   f"SkyPilot mounts no bucket on {cloud.name}")
    best = nodes > 1 and (cloud.network_best is None or (
        name in cloud.network_best and spec.strategy.gpus == 8))
    return SkyChoice(
        cloud=cloud, accelerator=name,
        storage=Storage.BUCKET_MOUNT if cloud.mount else Storage.LOCAL_SYNC,
        network_best=best,
        instance_listed=offer.instance_type in catalog.instance_types.get(cloud.name, ()),
        region_listed=offer.region in catalog.regions.get(cloud.name, ()))


# ------------------------------------------------------------------------------ dstack
#: Canonical provider name -> dstack backend (dstack 0.22 ``BackendType`` values).
DSTACK_BACKENDS: dict[str, str] = {
    "AWS": "aws", "GCP": "gcp", "Azure": "azure", "Lambda": "lambda", "RunPod": "runpod",
    "Vast.ai": "vastai", "Nebius": "nebius", "Cudo": "cudo", "Oracle (OCI)": "oci",
    "Verda (ex-DataCrunch)": "verda", "Jarvislabs": "jarvislabs", "Seeweb": "seeweb",
    "Lium": "lium", "Daytona": "daytona", "CloudRift": "cloudrift", "TensorDock": "tensordock",
    "Crusoe": "crusoe", "Vultr": "vultr", "Hot Aisle": "hotaisle",
    "DigitalOcean": "digitalocean",
}
#: Backends with network volumes a volume file can create (``ComputeWithVolumeSupport`` and
#: a volume configuration with ``size`` and ``region``; daytona and lium only register
#: existing volumes by ``volume_id``), multi-node runs (``ComputeWithMultinodeSupport``)
#: and instance volumes (``ComputeWithInstanceVolumesSupport``).
DSTACK_VOLUME_BACKENDS = frozenset({"aws", "gcp", "kubernetes", "runpod"})
DSTACK_REGISTER_ONLY_VOLUME_BACKENDS = frozenset({"daytona", "lium"})
DSTACK_MULTINODE_BACKENDS = frozenset({"aws", "azure", "crusoe", "gcp", "jarvislabs",
                                       "kubernetes", "nebius", "oci", "runpod", "seeweb",
                                       "slurm", "vultr"})
DSTACK_INSTANCE_VOLUME_BACKENDS = frozenset({
    "amddevcloud", "aws", "azure", "cloudrift", "crusoe", "digitalocean", "gcp", "hotaisle",
    "jarvislabs", "kubernetes", "lambda", "nebius", "oci", "seeweb", "verda", "vultr"})
#: Backends whose network volume several runs (nodes) may mount at once (dstack docs,
#: concepts/volumes.md: "currently supported only by the runpod backend").
DSTACK_SHARED_VOLUME_BACKENDS = frozenset({"runpod"})

#: Canonical GPU -> (gpuhunt name, memory in GB or None when the name alone is unique).
GPUHUNT_NAMES: dict[str, tuple[str, int | None]] = {
    "T4": ("T4", None), "V100 SXM2 16GB": ("V100", 16), "V100 SXM2 32GB": ("V100", 32),
    "V100 PCIe 16GB": ("V100", 16), "V100 PCIe 32GB": ("V100", 32), "A10": ("A10", None),
    "A10G": ("A10G", None), "L4": ("L4", None), "L40": ("L40", None), "L40S": ("L40S", None),
    "A40": ("A40", None), "RTX A6000": ("A6000", None), "RTX 6000 Ada": ("RTX6000Ada", None),
    "RTX 3090": ("RTX3090", None), "RTX 4090": ("RTX4090", None),
    "RTX 5090": ("RTX5090", None), "A100 40GB PCIe": ("A100", 40),
    "A100 40GB SXM4": ("A100", 40), "A100 80GB PCIe": ("A100", 80),
    "A100 80GB SXM4": ("A100", 80), "H100 PCIe": ("H100", None), "H100 SXM5": ("H100", None),
    "H100 NVL": ("H100NVL", None), "H200 SXM": ("H200", None), "H200 NVL": ("H200NVL", None),
    "GH200 (96GB HBM3)": ("GH200", None), "B200 (HGX)": ("B200", None),
    "B300 (HGX)": ("B300", None), "GB200 (per Blackwell GPU)": ("GB200", None),
    "GB300 (per Blackwell Ultra GPU)": ("GB300", None), "MI250X": ("MI250X", None),
    "MI300X": ("MI300X", None), "MI325X": ("MI325X", None), "MI355X": ("MI355X", None),
    "P100": ("P100", None), "A16": ("A16", None), "RTX A4000": ("A4000", None),
    "RTX A4500": ("A4500", None), "RTX A5000": ("A5000", None),
    "RTX 3060": ("RTX3060", 12), "RTX 3070": ("RTX3070", None),
    "RTX 3080": ("RTX3080", None), "RTX 4060": ("RTX4060", None),
    "RTX 4060 Ti 16GB": ("RTX4060Ti", 16), "RTX 4070": ("RTX4070", None),
    "RTX 4070 Ti Super": ("RTX4070TiSUPER", None), "Quadro RTX 6000": ("RTX6000", None),
    "RTX 4000 Ada": ("RTX4000Ada", None), "RTX PRO 6000 Blackwell": ("RTXPRO6000", None),
    "RTX 2060": ("RTX2060", 6), "RTX 2060 12GB": ("RTX2060", 12),
    "RTX 2060 Super": ("RTX2060SUPER", None), "RTX 2070": ("RTX2070", None),
    "RTX 2070 Super": ("RTX2070SUPER", None), "RTX 2080": ("RTX2080", None),
    "RTX 2080 Super": ("RTX2080SUPER", None), "RTX 2080 Ti": ("RTX2080Ti", None),
    "RTX 3050 6GB": ("RTX3050", 6), "RTX 3050": ("RTX3050", 8),
    "RTX 3060 8GB": ("RTX3060", 8), "RTX 3060 Ti": ("RTX3060Ti", None),
    "RTX 3070 Ti": ("RTX3070Ti", None), "RTX 3080 Ti": ("RTX3080Ti", None),
    "RTX 3090 Ti": ("RTX3090Ti", None), "RTX 4060 Ti 8GB": ("RTX4060Ti", 8),
    "RTX 4070 Super": ("RTX4070SUPER", None), "RTX 4070 Ti": ("RTX4070Ti", None),
    "RTX 4080": ("RTX4080", None), "RTX 4080 Super": ("RTX4080SUPER", None),
    "RTX 5060": ("RTX5060", None), "RTX 5060 Ti 8GB": ("RTX5060Ti", 8),
    "RTX 5060 Ti 16GB": ("RTX5060Ti", 16), "RTX 5070": ("RTX5070", None),
    "RTX 5070 Ti": ("RTX5070Ti", None), "RTX 5080": ("RTX5080", None),
    "RTX 2000 Ada": ("RTX2000Ada", None), "MI100": ("MI100", None), "MI210": ("MI210", None),
    "MI250": ("MI250", None), "MI350X": ("MI350X", None),
}
#: AMD GPUs: dstack runs them from a ROCm image (dstack's AMD examples use rocm/pytorch).
AMD_GPUS = frozenset({"MI100", "MI210", "MI250", "MI250X", "MI300X", "MI325X", "MI350X",
                      "MI355X", "Radeon Instinct MI25"})
ROCM_IMAGE = "rocm/pytorch:rocm6.3.3_ubuntu22.04_py3.10_pytorch_release_2.4.0"


@dataclass(frozen=True, slots=True)
class DstackChoice:
    backend: str | None  # None: the provider is no dstack backend; dstack picks one
    gpu: str             # ``name[:memory]`` without the count
    storage: Storage
    volume_region: str | None  # the network volume's region (the offer's own)
    image: str | None          # a ROCm image for AMD GPUs, else None (dstack's default)


def dstack_gpu(gpu: str) -> str | None:
    entry = GPUHUNT_NAMES.get(gpu)
    if entry is None:
        return None
    name, memory = entry
    return name if memory is None else f"{name}:{memory}GB"


def dstack_backend(provider: str) -> str | None:
    """dstack's backend for an offer's provider; a resold offer is the reseller's."""
    return DSTACK_BACKENDS.get(normalise_provider_name(selling_provider(provider)))


def _volume_region(backend: str, spec: LaunchSpec) -> str:
    """The offer's own region as dstack names it: RunPod's data centre is the zone."""
    offer = spec.offer
    return (offer.zone or offer.region) if backend == "runpod" else offer.region


def dstack_choice(spec: LaunchSpec) -> DstackChoice | Refusal:
    """dstack's backend, GPU name and checkpoint storage for the plan's offer, or why dstack
    cannot launch it as planned."""
    offer, nodes = spec.offer, spec.strategy.nodes
    gpu = dstack_gpu(offer.gpu)
    if gpu is None:
        return Refusal("dstack", f"gpuhunt (dstack's GPU names) has no name for {offer.gpu}")
    backend = dstack_backend(offer.provider)
    image = ROCM_IMAGE if offer.gpu in AMD_GPUS else None
    if backend is None:
        if nodes > 1:
            return Refusal("dstack", f"{offer.provider!r} is no dstack backend, so no shared "
                                     f"checkpoint storage can be named for {nodes} nodes")
        return DstackChoice(backend=None, gpu=gpu, storage=Storage.LOCAL_SYNC,
                            volume_region=None, image=image)
    if nodes > 1:
        if backend not in DSTACK_MULTINODE_BACKENDS:
            return Refusal("dstack", f"dstack runs no multi-node tasks on {backend}")
        if backend in DSTACK_SHARED_VOLUME_BACKENDS:
            return DstackChoice(backend=backend, gpu=gpu, storage=Storage.NETWORK_VOLUME,
                                volume_region=_volume_region(backend, spec), image=image)
        if backend in DSTACK_INSTANCE_VOLUME_BACKENDS:
            return DstackChoice(backend=backend, gpu=gpu, storage=Storage.SHARED_HOST_PATH,
                                volume_region=None, image=image)
        return Refusal("dstack", f"{nodes} nodes need one shared checkpoint location and "
                                 f"dstack's {backend} has no shared volume or instance path")
    if backend in DSTACK_VOLUME_BACKENDS:
        return DstackChoice(backend=backend, gpu=gpu, storage=Storage.NETWORK_VOLUME,
                            volume_region=_volume_region(backend, spec), image=image)
    return DstackChoice(backend=backend, gpu=gpu, storage=Storage.LOCAL_SYNC,
                        volume_region=None, image=image)
