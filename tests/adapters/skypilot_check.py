"""Run by SkyPilot's own interpreter (``.venv-sky/bin/python``), never imported by the tests.

Reads on stdin ``{"cases": {id: path to a sky.yaml}, "clouds": [cloud, ...]}`` and prints one
JSON object: per case, what SkyPilot made of the task, offline and without credentials,
through the calls its optimizer makes before it provisions anything (skypilot 0.14.1:
``Task.from_yaml`` validates the YAML against its schemas and builds ``Resources``, which
canonicalises the accelerator name and validates the cloud; ``check_features_are_supported``
with the features the task and its resources require; ``get_feasible_launchable_resources``,
the instance types of the cloud's catalog that hold the accelerators). Per cloud asked:
whether it supports multi-node clusters, bucket mounts and spot instances.
The catalog is read from ``$SKY_RUNTIME_DIR/.sky/catalogs/v8`` (the test puts the bundled
snapshot there), so nothing is downloaded.
"""

from __future__ import annotations

import json
import sys
from typing import Any


def check_task(path: str) -> dict[str, Any]:
    import sky
    from sky import exceptions

    try:
        task = sky.Task.from_yaml(path)
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    (resources,) = task.resources
    cloud = resources.cloud
    features = task.get_required_cloud_features() | resources.get_required_cloud_features()
    try:
        cloud.check_features_are_supported(resources, features)
        unsupported = None
    except exceptions.NotSupportedError as exc:
        unsupported = str(exc)
    feasible = cloud.get_feasible_launchable_resources(resources, num_nodes=task.num_nodes)
    mounts = {dst: {"name": s.name, "mode": s.mode.value,
                    "stores": sorted(t.value for t in s.stores)}
              for dst, s in task.storage_mounts.items()}
    tier = resources.network_tier
    return {
        "cloud": cloud.canonical_name(), "num_nodes": task.num_nodes,
        "accelerators": resources.accelerators, "use_spot": resources.use_spot,
        "instance_type": resources.instance_type, "region": resources.region,
        "disk_size": resources.disk_size, "job_recovery": resources.job_recovery,
        "network_tier": tier.value if tier is not None else None,
        "features": sorted(f.value for f in features), "unsupported": unsupported,
        "feasible": sorted({r.instance_type for r in feasible.resources_list}),
        "hint": feasible.hint, "storage_mounts": mounts,
        "envs": task.envs, "secrets": sorted(task.secrets),
        # A secret with no value: a reference resolved at launch (``--secret NAME``).
        "secret_refs": sorted(ref.name for ref in task.managed_secret_refs),
    }


def check_cloud(name: str) -> dict[str, Any]:
    import sky
    from sky import exceptions
    from sky.clouds import CloudImplementationFeatures as F
    from sky.utils import registry

    cloud = registry.CLOUD_REGISTRY.from_str(name)
    if cloud is None:
        return {"error": f"no cloud {name!r}"}
    out: dict[str, Any] = {"canonical": cloud.canonical_name()}
    for key, feature in (("multi_node", F.MULTI_NODE), ("mount", F.STORAGE_MOUNTING),
                         ("spot", F.SPOT_INSTANCE)):
        try:
            cloud.check_features_are_supported(sky.Resources(infra=name), {feature})
            out[key] = True
        except exceptions.NotSupportedError:
            out[key] = False
    return out


def main() -> int:
    request = json.load(sys.stdin)
    import sky

    out: dict[str, Any] = {"version": sky.__version__, "cases": {}, "clouds": {}}
    for case, path in request.get("cases", {}).items():
        out["cases"][case] = check_task(path)
    for name in request.get("clouds", []):
        try:
            out["clouds"][name] = check_cloud(name)
        except Exception as exc:
            out["clouds"][name] = {"error": f"{type(exc).__name__}: {exc}"}
    print("RESULT " + json.dumps(out, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
