"""The declarative side parses and matches what Ray, KubeRay and the jobs expect."""

import configparser
import re
import subprocess
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def test_cluster_yaml_passes_rays_schema_and_every_node_runs_the_projects_image():
    """Every node runs the project's image (its Python 3.11 installs the pins; the AMI's Python runs nothing of
    ours) tagged by the project's version; nothing is installed when a node starts."""
    from ray.autoscaler._private.util import prepare_config, validate_config

    raw = yaml.safe_load((ROOT / "cluster.yaml").read_text())
    validate_config(prepare_config(raw))
    version = re.search(r'^version = "([^"]+)"$', (ROOT / "pyproject.toml").read_text(), re.MULTILINE).group(1)
    assert raw["docker"]["image"].endswith(f"/cocolm-ray:{version}")
    assert not any("pip install" in c for key in ("setup_commands", "head_setup_commands", "worker_setup_commands")
                   for c in raw.get(key, []))
    assert raw["head_setup_commands"] == []  # Ray's default would pip-install an unpinned boto3 on the head
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


MLFLOW = ROOT / "platform" / "mlflow"


def test_mlflow_server_recipe_uses_a_database_and_object_store():
    start = (MLFLOW / "start.sh").read_text()
    assert "MLFLOW_BACKEND_STORE_URI:=postgresql://" in start and "MLFLOW_ARTIFACTS_DESTINATION:=s3://" in start
    assert '--backend-store-uri "$MLFLOW_BACKEND_STORE_URI"' in start and "--serve-artifacts" in start
    assert "--app-name basic-auth" in start


def test_mlflow_recipe_pins_every_image_by_digest_and_installs_nothing_at_start():
    """Each image is `name:tag@${X_DIGEST:?...}`: compose refuses to start while a digest is unset (the
    recipe cannot pull images to learn them); the server is one image built from the pinned MLflow release
    with pinned packages, so no container runs pip (it pulled unpinned packages as root at every start)."""
    text = (MLFLOW / "docker-compose.yaml").read_text()
    compose = yaml.safe_load(text)
    refs = [s["image"] for s in compose["services"].values() if "build" not in s]
    refs += [arg for s in compose["services"].values() if "build" in s for arg in s["build"]["args"].values()]
    assert len(refs) == 4
    for ref in refs:
        assert re.fullmatch(r"[\w./-]+:[\w.-]+@\$\{[A-Z]+_DIGEST:\?pin the image: set [A-Z]+_DIGEST=sha256:[^}]+\}", ref), ref
        assert ":latest" not in ref
    assert "pip install" not in text and "latest" not in text
    assert all("command" not in s or "pip" not in str(s["command"]) for s in compose["services"].values())
    built = compose["services"]["mlflow"]
    assert "dockerfile" not in built["build"]
    dockerfile = (MLFLOW / "Dockerfile").read_text()
    assert "FROM ${MLFLOW_BASE}" in dockerfile and "USER mlflow" in dockerfile
    (install,) = [line for line in dockerfile.splitlines() if "pip install" in line]
    packages = install.split("pip install --no-cache-dir")[1].split("\\")[0].split()
    assert packages and all(re.fullmatch(r"[\w-]+==[\d.]+", p) for p in packages), packages
    assert "pip " not in (MLFLOW / "start.sh").read_text()


def test_mlflow_recipe_runs_a_minio_with_the_cve_2025_62506_fix_and_restarts_every_service():
    """MinIO's last published image (RELEASE.2025-09-07T16-13-09Z) predates the fix, released in
    RELEASE.2025-10-15T17-29-55Z as source only: the recipe builds that release, as a user without root."""
    compose = yaml.safe_load((MLFLOW / "docker-compose.yaml").read_text())
    minio = compose["services"]["minio"]
    assert minio["build"]["dockerfile"] == "minio.Dockerfile"
    dockerfile = (MLFLOW / minio["build"]["dockerfile"]).read_text()
    (release,) = re.findall(r"^ARG MINIO_RELEASE=RELEASE\.(\S+)$", dockerfile, re.MULTILINE)
    assert release >= "2025-10-15T17-29-55Z" and "--branch \"${MINIO_RELEASE}\"" in dockerfile
    assert re.search(r"^USER \d+", dockerfile, re.MULTILINE) and not re.search(r"^USER (0|root)\b", dockerfile, re.MULTILINE)
    assert all(s.get("restart") == "unless-stopped" for s in compose["services"].values())
    documents = list(yaml.safe_load_all((MLFLOW / "kubernetes.yaml").read_text()))
    (deployment,) = [d for d in documents if d["kind"] == "Deployment"]
    assert deployment["spec"]["template"]["spec"]["restartPolicy"] == "Always"


def test_the_password_rotation_the_readme_gives_is_one_mlflow_3_17_accepts():
    """MLflow 3.17's server refuses an account changing its own password without current_password; the
    README's command passes it, through the client's own parameter, and reads both from the terminal."""
    import mlflow  # the auth app itself needs Flask-WTF (the server image's), so its source is read, not imported

    auth = Path(mlflow.__file__).parent / "server" / "auth"
    server = (auth / "__init__.py").read_text()
    assert "Current password is required when changing your own password." in server
    assert re.search(r"def update_user_password\(\s*self, username: str, password: str, current_password",
                     (auth / "client.py").read_text())
    readme = (MLFLOW / "README.md").read_text()
    (call,) = [line for line in readme.splitlines() if 'c.update_user_password("admin"' in line]
    assert "current_password=current" in call and "getpass" in call
    assert "update_user_password('admin', '<new password>')" not in readme


def test_mlflow_accounts_read_by_default_and_write_where_granted():
    """default_permission = EDIT let every account replace the files of another's exported encoder."""
    config = configparser.ConfigParser()
    config.read(MLFLOW / "basic_auth.ini")  # as mlflow.server.auth.config.read_auth_config reads it
    assert config["mlflow"]["default_permission"] == "READ" and config["mlflow"]["admin_username"] == "admin"
    assert config["mlflow"]["database_uri"].startswith("sqlite:////mlflow-auth/")  # the compose file's volume
    assert "grant_user_permission(" in (MLFLOW / "README.md").read_text()


# ----------------------------------------------------------------------------- secure as shipped (docs/design.md 8)


def test_the_cluster_launcher_config_turns_on_ray_token_auth_on_every_node_and_keeps_the_dashboard_local():
    raw = yaml.safe_load((ROOT / "cluster.yaml").read_text())
    starts = raw["head_start_ray_commands"] + raw["worker_start_ray_commands"]
    assert raw["worker_start_ray_commands"] and all("RAY_AUTH_MODE=token" in c for c in starts
                                                    if "ray start" in c)
    assert not any("RAY_AUTH_MODE=disabled" in c or "0.0.0.0" in c for c in starts + raw["setup_commands"])
    (head,) = [c for c in raw["head_start_ray_commands"] if "ray start" in c]
    assert "--dashboard-host=127.0.0.1" in head  # reached through `ray dashboard cluster.yaml` (SSH)
    # The token reaches every node at Ray's default path, from a file outside the repository.
    token_mounts = {remote: local for remote, local in raw["file_mounts"].items() if remote.endswith(".ray/auth_token")}
    assert len(token_mounts) == 1 and next(iter(token_mounts.values())).startswith("~/.ray/")
    assert ".env" in raw["rsync_exclude"]


def test_the_rayjob_turns_on_ray_token_auth_for_every_container_and_exposes_nothing():
    text = (ROOT / "platform" / "kuberay" / "rayjob.yaml").read_text()
    cluster = yaml.safe_load(text)["spec"]["rayClusterSpec"]
    assert cluster["authOptions"] == {"mode": "token"}  # KubeRay: token Secret + env on every Ray container
    head = cluster["headGroupSpec"]
    assert head.get("serviceType", "ClusterIP") == "ClusterIP"
    assert "dashboard-host" not in head["rayStartParams"] and "RAY_AUTH_MODE: disabled" not in text
    containers = [c for g in [head, *cluster["workerGroupSpecs"]] for c in g["template"]["spec"]["containers"]]
    for container in containers:  # MLflow's account from a Secret, never a literal
        env = {e["name"]: e for e in container.get("env", [])}
        assert env["MLFLOW_TRACKING_PASSWORD"]["valueFrom"]["secretKeyRef"]["name"] == "cocolm-mlflow"
        assert all("value" not in e for e in env.values() if "PASSWORD" in e["name"] or "TOKEN" in e["name"])


def test_the_mlflow_server_recipe_holds_no_password_publishes_only_mlflow_and_requires_accounts():
    text = (ROOT / "platform" / "mlflow" / "docker-compose.yaml").read_text()
    services = yaml.safe_load(text)["services"]
    for name, service in services.items():
        values = service.get("environment", {})
        values = values if isinstance(values, dict) else dict(v.split("=", 1) for v in values)
        for key, value in values.items():  # every secret is a ${VAR:?...} read from .env
            if any(word in key for word in ("PASSWORD", "SECRET", "ACCESS_KEY", "TOKEN")):
                assert str(value).startswith("${") and ":?" in str(value), (name, key, value)
        if name != "mlflow":
            assert "ports" not in service, name  # PostgreSQL and MinIO only on the compose network
    assert not re.search(r"://[^/\s:@]+:[^@\s]+@", text)  # no user:password@ in a URI
    assert services["mlflow"]["ports"] == ["${MLFLOW_PUBLISH:-127.0.0.1:5000}:5000"]
    command = (ROOT / "platform" / "mlflow" / "start.sh").read_text()  # the built image's start
    assert "--app-name basic-auth" in command and "--allowed-hosts" in command
    ignored = subprocess.run(["git", "check-ignore", "-q", "platform/mlflow/.env"], cwd=ROOT)
    assert ignored.returncode == 0  # the file the README has you write the secrets into is never committed


def test_the_cluster_launcher_syncs_no_code_folder_and_keeps_outputs_outside_the_container():
    """The code travels with each job (jobs.submit), the dependencies with the image: a synced checkout was
    also the default $COCOLM_HOME, so ray_results/ and locks landed in it and were copied to every new worker.
    Outputs go to the host's disk, bound at the image's $COCOLM_HOME. The rsync rules stay for any folder
    added later: git's ignore rules and the secret patterns."""
    raw = yaml.safe_load((ROOT / "cluster.yaml").read_text())
    assert set(raw["file_mounts"]) == {"~/.ray/auth_token"}
    assert "ENV COCOLM_HOME=/home/ray/cocolm-home" in (ROOT / "Dockerfile").read_text()
    assert "-v /home/ubuntu/cocolm-home:/home/ray/cocolm-home" in raw["docker"]["run_options"]
    assert any(c.startswith("mkdir -p -m 700 /home/ubuntu/cocolm-home") for c in raw["initialization_commands"])
    assert raw["rsync_filter"] == [".gitignore"]
    assert {"**/.git", "**/.git/**", ".env", "**/.env", "*.private.yaml", "mlflow.db"} <= set(raw["rsync_exclude"])
    ignored = (ROOT / ".gitignore").read_text().splitlines()
    assert {".venv/", "/mlflow.db", ".env", "*.private.yaml"} <= set(ignored)


def test_the_runtime_env_names_no_shared_temporary_path():
    """A fixed /tmp path (COCOLM_HOME: /tmp/cocolm-ray was one) can be created first by another user, who
    then owns the job's checkpoints and MLflow store."""
    env = yaml.safe_load((ROOT / "platform" / "runtime_env.yaml").read_text())
    assert not any(str(v).startswith(("/tmp", "/var/tmp", "/dev/shm")) for v in env["env_vars"].values())
    assert ".git" in env["excludes"]


def test_every_preset_states_its_cost_measured_or_estimated():
    """A user picks a preset by what it costs: each says on what (CPU cores or GPUs) and how many hours or
    minutes, and whether that was measured or is an estimate."""
    import re

    for path in sorted((ROOT / "platform" / "presets").glob("*.yaml")):
        cost = [line for line in path.read_text().splitlines() if line.startswith("# cost: ")]
        assert len(cost) == 1, path.name
        assert re.search(r"\d+ (CPU cores|GPUs?)", cost[0]) and re.search(r"\d+ (hours|minutes)", cost[0]), cost[0]
        assert "measured" in cost[0] or "estimate" in cost[0], cost[0]

