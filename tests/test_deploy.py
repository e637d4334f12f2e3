"""deploy/: the KubeRay RayJob manifest parses, hangs together, and its population file is a valid
`phalanx population run ... --backend ray` config (none of it needs Ray or Kubernetes)."""

from __future__ import annotations

from pathlib import Path

import yaml

from phalanx.cli import parse_population_args

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"


def documents() -> dict[str, dict]:
    docs = [d for d in yaml.safe_load_all((DEPLOY / "rayjob.yaml").read_text()) if d is not None]
    return {d["kind"]: d for d in docs}


def mounts(pod_template: dict) -> tuple[dict[str, str], dict[str, dict]]:
    """({volume name: mount path}, {volume name: volume}) of a pod template's first container."""
    spec = pod_template["spec"]
    container = spec["containers"][0]
    return (
        {m["name"]: m["mountPath"] for m in container.get("volumeMounts", [])},
        {v["name"]: v for v in spec.get("volumes", [])},
    )


def test_rayjob_manifest_is_consistent(tmp_path):
    kinds = documents()
    assert set(kinds) == {"ConfigMap", "PersistentVolumeClaim", "RayJob"}
    claim = kinds["PersistentVolumeClaim"]
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"], "every node writes the population directory"

    job = kinds["RayJob"]
    assert job["apiVersion"] == "ray.io/v1"
    assert job["spec"]["entrypoint"].split() == [
        "phalanx", "population", "run", "/config/population.yaml", "--backend", "ray"
    ]  # fmt: skip
    cluster = job["spec"]["rayClusterSpec"]

    # the head (the driver) and every worker group mount the claim at the same path
    head_mounts, head_volumes = mounts(cluster["headGroupSpec"]["template"])
    config_map = kinds["ConfigMap"]["metadata"]["name"]
    config_volume = next(
        n for n, v in head_volumes.items() if v.get("configMap", {}).get("name") == config_map
    )
    assert head_mounts[config_volume] == "/config"
    claim_name = claim["metadata"]["name"]
    paths = set()
    groups = [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]
    for group in groups:
        group_mounts, volumes = mounts(group["template"])
        shared = [
            n for n, v in volumes.items() if v.get("persistentVolumeClaim", {}).get("claimName") == claim_name
        ]
        assert len(shared) == 1, group
        paths.add(group_mounts[shared[0]])
        assert group["template"]["spec"]["containers"][0]["image"]
    assert len(paths) == 1
    (shared_path,) = paths

    # the population file the entrypoint reads: valid, and its directory on the shared volume
    population_file = tmp_path / "population.yaml"
    population_file.write_text(kinds["ConfigMap"]["data"]["population.yaml"])
    config = parse_population_args([str(population_file), "--backend", "ray"])
    assert config.backend == "ray" and config.address is None  # a RayJob's driver gets RAY_ADDRESS
    assert Path(config.directory).is_relative_to(shared_path)


def test_dockerfile_installs_phalanx_with_ray():
    text = (DEPLOY / "Dockerfile").read_text()
    assert '".[ray]"' in text and "torch==${TORCH_VERSION}" in text and "whl/cpu" in text
    rayjob = documents()["RayJob"]
    version = rayjob["spec"]["rayClusterSpec"]["rayVersion"]
    assert f"ARG RAY_VERSION={version}" in text, "the image's Ray is the version the RayJob names"
