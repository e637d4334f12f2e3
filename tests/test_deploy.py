"""deploy/: the KubeRay RayJob manifest parses, hangs together, and its population file is a valid
`phalanx population run ... --backend ray` config (none of it needs Ray or Kubernetes)."""

from __future__ import annotations

import shlex
from pathlib import Path

import yaml

from phalanx.cli import parse_population_args, parse_train_args

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
        "phalanx", "population", "run", "/config/population.yaml", "--backend", "ray", "--resume"
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
    config = parse_population_args([str(population_file), "--backend", "ray", "--resume"])
    assert config.backend == "ray" and config.address is None  # a RayJob's driver gets RAY_ADDRESS
    assert config.base.resume and config.directory  # run again, it continues the population there
    assert Path(config.directory).is_relative_to(shared_path)


def test_dockerfile_installs_phalanx_with_ray():
    text = (DEPLOY / "Dockerfile").read_text()
    assert '".[ray]"' in text and "torch==${TORCH_VERSION}" in text and "whl/cpu" in text
    rayjob = documents()["RayJob"]
    version = rayjob["spec"]["rayClusterSpec"]["rayVersion"]
    assert f"ARG RAY_VERSION={version}" in text, "the image's Ray is the version the RayJob names"


def command_of_slurm_script() -> tuple[dict[str, str], list[str]]:
    """deploy/slurm.sbatch: its #SBATCH options, and the phalanx command it execs (variables expanded)."""
    text = (DEPLOY / "slurm.sbatch").read_text()
    options = {}
    for line in text.splitlines():
        if line.startswith("#SBATCH "):
            key, _, value = line[len("#SBATCH ") :].partition("=")
            options[key] = value
    command = text[text.index("exec phalanx") :].replace("\\\n", " ")
    command = command.replace('"$RUN_DIR"', "/scratch/runs/pendulum-sac")
    return options, shlex.split(command)[1:]


def test_slurm_script_requeues_and_its_command_starts_or_continues_the_run():
    options, command = command_of_slurm_script()
    assert "--requeue" in options and options["--open-mode"] == "append"
    assert options["--signal"].startswith("B:TERM@")  # to the batch shell, which phalanx replaced (exec)
    assert command[:2] == ["phalanx", "train"]
    config = parse_train_args(command[2:])
    assert config.resume and config.run_dir == "/scratch/runs/pendulum-sac" and config.save_buffer


def test_kubernetes_job_replaces_a_disrupted_pod_whose_command_continues_the_run():
    docs = [d for d in yaml.safe_load_all((DEPLOY / "train-job.yaml").read_text()) if d is not None]
    kinds = {d["kind"]: d for d in docs}
    job = kinds["Job"]["spec"]
    rules = job["podFailurePolicy"]["rules"]
    assert {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]} in rules
    pod = job["template"]["spec"]
    assert pod["restartPolicy"] == "Never" and pod["terminationGracePeriodSeconds"] >= 30
    container = pod["containers"][0]
    command = container["command"]
    assert command[:2] == ["phalanx", "train"]
    config = parse_train_args(command[2:])
    assert config.resume
    (mount,) = container["volumeMounts"]
    assert Path(config.run_dir).is_relative_to(mount["mountPath"])  # the run outlives the pod
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    assert volume["persistentVolumeClaim"]["claimName"] == kinds["PersistentVolumeClaim"]["metadata"]["name"]
