"""The declarative side parses and matches what Ray, KubeRay and the jobs expect."""

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def test_cluster_yaml_passes_rays_schema_and_installs_the_project():
    from ray.autoscaler._private.util import prepare_config, validate_config

    raw = yaml.safe_load((ROOT / "cluster.yaml").read_text())
    validate_config(prepare_config(raw))
    assert any("pip install" in c and "cocolm-ray" in c for c in raw["setup_commands"])
    assert any(t["resources"].get("GPU") for t in raw["available_node_types"].values())


def test_runtime_env_is_a_valid_ray_runtime_env():
    from ray.runtime_env import RuntimeEnv

    env = RuntimeEnv(**yaml.safe_load((ROOT / "platform" / "runtime_env.yaml").read_text()))
    assert env["env_vars"]["HF_HUB_OFFLINE"] == "1"


def test_rayjob_runs_the_pretraining_entry_point_with_a_known_preset():
    job = yaml.safe_load((ROOT / "platform" / "kuberay" / "rayjob.yaml").read_text())
    assert job["kind"] == "RayJob" and job["apiVersion"] == "ray.io/v1"
    entry = job["spec"]["entrypoint"].split()
    assert entry[:3] == ["python", "-m", "jobs.pretraining"]
    preset = entry[entry.index("--preset") + 1]
    assert (ROOT / "platform" / "presets" / f"{preset}.yaml").is_file()
    assert job["spec"]["rayClusterSpec"]["rayVersion"] == "2.60.0"


def test_mlflow_server_recipe_uses_a_database_and_object_store():
    compose = yaml.safe_load((ROOT / "platform" / "mlflow" / "docker-compose.yaml").read_text())
    command = compose["services"]["mlflow"]["command"]
    assert "--backend-store-uri postgresql://" in command and "--artifacts-destination s3://" in command
