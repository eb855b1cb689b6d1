"""`python -m jobs.preflight` passes the shipped cluster.yaml and RayJob, and refuses each defect a first
launch would meet, each as one `error:` line naming the file and the key; the Dockerfile's install is the
pinned install CI makes in Python 3.11."""

import contextlib
import copy
import gzip
import io
import hashlib
import re
import shlex
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

from jobs import preflight

ROOT = Path(__file__).resolve().parents[1]
CLUSTER = yaml.safe_load((ROOT / "cluster.yaml").read_text())
RAYJOB = yaml.safe_load((ROOT / "platform" / "kuberay" / "rayjob.yaml").read_text())


def run(tmp_path, document, *flags, name="file.yaml"):
    """The pre-flight on a copy of a document, its command line run in this process: (exit status, its lines).
    The command itself, `python -m jobs.preflight`, runs in a process of its own in the tests of the shipped
    files below; here each case saves that process's start."""
    path = tmp_path / name
    path.write_text(yaml.safe_dump(document))
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            code = preflight.main([*flags, str(path)])
        except SystemExit as exit:  # argparse's usage errors
            code = exit.code
    return code, out.getvalue().splitlines()


def refused(tmp_path, document, key, *flags):
    code, lines = run(tmp_path, document, *flags)
    errors = [line for line in lines if line.startswith("error: ")]
    assert code == 1, lines
    assert any(key in line for line in errors), lines
    assert all(line.startswith(f"error: {tmp_path / 'file.yaml'}: ") for line in errors), errors
    return errors


def test_the_shipped_files_pass_and_list_only_their_placeholders():
    result = subprocess.run([sys.executable, "-m", "jobs.preflight", "cluster.yaml", "platform/kuberay/rayjob.yaml",
                             "--storage", "s3://bucket/cocolm"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert "ok: cluster.yaml" in " ".join(lines) and "ok: platform/kuberay/rayjob.yaml" in " ".join(lines)
    assert not [line for line in lines if line.startswith("error")]
    assert all("REPLACE-ME" in line for line in lines if line.startswith("todo"))


def test_strict_refuses_the_placeholders_the_template_leaves():
    result = subprocess.run([sys.executable, "-m", "jobs.preflight", "--strict", "cluster.yaml"], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    assert any(line.startswith("error: cluster.yaml: available_node_types.head.node_config.ImageId: ami-REPLACE-ME")
               for line in result.stdout.splitlines())


def test_filled_in_files_pass_strict(tmp_path):
    filled = yaml.safe_load(yaml.safe_dump(CLUSTER).replace("REPLACE-ME-ACCOUNT", "123456789012")
                            .replace("ami-REPLACE-ME", "ami-0123456789abcdef0").replace("sg-REPLACE-ME", "sg-0123456789abcdef0"))
    code, lines = run(tmp_path, filled, "--strict", "--storage", "s3://bucket/cocolm")
    assert code == 0, lines
    job = yaml.safe_load(yaml.safe_dump(RAYJOB).replace("REPLACE-ME-REGISTRY", "registry.example/team")
                         .replace("REPLACE-ME-BUCKET", "bucket"))
    code, lines = run(tmp_path, job, "--strict")
    assert code == 0, lines


# ------------------------------------------------------------------------------ the launcher config's rules


def test_rays_own_validator_refuses_a_field_ray_does_not_know(tmp_path):
    broken = copy.deepcopy(CLUSTER)
    broken["available_node_types"]["gpu_worker"]["min_wokers"] = 1
    (line,) = refused(tmp_path, broken, "available_node_types.gpu_worker")
    assert "Ray's schema refuses it" in line and "min_wokers" in line


def test_nodes_without_the_projects_image_run_the_amis_python(tmp_path):
    broken = copy.deepcopy(CLUSTER)
    del broken["docker"]
    (line, *_) = refused(tmp_path, broken, "docker.image")
    assert "3.10" in line and ">=3.11" in line


@pytest.mark.parametrize(("image", "words"), [
    ("rayproject/ray:2.60.0-py310-gpu", ("Python 3.10",)),  # its Python is below the pins
    ("registry.example/cocolm-ray:latest", ("moves", ":0.1.0")),  # a tag that moves
    ("registry.example/cocolm-ray", ("moves", ":0.1.0")),  # no tag: Docker's latest
    ("registry.example/cocolm-ray:0.0.9", ("pyproject.toml's version is 0.1.0",)),  # ours, another version
])
def test_an_image_a_first_launch_would_fail_on_is_refused(tmp_path, image, words):
    broken = copy.deepcopy(CLUSTER)
    broken["docker"]["image"] = image
    (line,) = refused(tmp_path, broken, "docker.image")
    assert all(word in line for word in words), line


def test_installing_at_node_start_is_refused(tmp_path):
    broken = copy.deepcopy(CLUSTER)
    broken["setup_commands"].append("pip install -e ~/cocolm-ray")
    refused(tmp_path, broken, "setup_commands")
    del broken["head_setup_commands"]
    broken["setup_commands"].pop()
    (line,) = refused(tmp_path, broken, "head_setup_commands")
    assert "unpinned boto3" in line


def test_a_node_type_without_credentials_cannot_reach_the_storage(tmp_path):
    broken = copy.deepcopy(CLUSTER)
    del broken["available_node_types"]["gpu_worker"]["node_config"]["IamInstanceProfile"]
    (line,) = refused(tmp_path, broken, "available_node_types.gpu_worker.node_config.IamInstanceProfile")
    assert "cocolm-worker" in line


def test_workers_sharing_the_heads_profile_get_its_ec2_rights(tmp_path):
    broken = copy.deepcopy(CLUSTER)
    broken["available_node_types"]["gpu_worker"]["node_config"]["IamInstanceProfile"] = {"Name": "cocolm-head"}
    refused(tmp_path, broken, "available_node_types.head.node_config.IamInstanceProfile")


def test_storage_no_node_can_reach_is_refused(tmp_path):
    refused(tmp_path, CLUSTER, "--storage", "--storage", "/home/ubuntu/checkpoints")
    refused(tmp_path, CLUSTER, "--storage", "--storage", "gs://bucket/cocolm")
    code, lines = run(tmp_path, CLUSTER, "--storage", "/fsx/checkpoints", "--shared-fs")
    assert code == 0, lines


def test_rays_default_security_group_and_ssh_from_anywhere_are_refused(tmp_path):
    broken = copy.deepcopy(CLUSTER)
    del broken["available_node_types"]["head"]["node_config"]["SecurityGroupIds"]
    (line,) = refused(tmp_path, broken, "available_node_types.head.node_config.SecurityGroupIds")
    assert "0.0.0.0/0" in line
    broken = copy.deepcopy(CLUSTER)
    broken["provider"]["security_group"] = {"IpPermissions": [
        {"FromPort": 22, "ToPort": 22, "IpProtocol": "tcp", "IpRanges": [{"CidrIp": "0.0.0.0/0"}]}]}
    refused(tmp_path, broken, "provider.security_group.IpPermissions[0]")


def test_ray_start_without_token_auth_is_refused(tmp_path):
    broken = copy.deepcopy(CLUSTER)
    broken["docker"]["run_options"].remove("--env RAY_AUTH_MODE=token")
    broken["worker_start_ray_commands"] = ["ray stop && ray start --address=$RAY_HEAD_IP:6379"]
    refused(tmp_path, broken, "worker_start_ray_commands")
    broken = copy.deepcopy(CLUSTER)
    broken["setup_commands"].append("export RAY_AUTH_MODE=disabled")
    refused(tmp_path, broken, "RAY_AUTH_MODE")
    broken = copy.deepcopy(CLUSTER)
    broken["file_mounts"] = {}
    refused(tmp_path, broken, "file_mounts")


def test_a_dashboard_beyond_localhost_is_refused(tmp_path):
    broken = copy.deepcopy(CLUSTER)
    broken["head_start_ray_commands"] = [c.replace("--dashboard-host=127.0.0.1", "--dashboard-host=0.0.0.0")
                                         for c in broken["head_start_ray_commands"]]
    (line,) = refused(tmp_path, broken, "head_start_ray_commands")
    assert "0.0.0.0" in line and "ray dashboard cluster.yaml" in line


def test_usage_reporting_left_on_at_ray_start_is_refused(tmp_path):
    broken = copy.deepcopy(CLUSTER)
    broken["head_start_ray_commands"] = [c.replace(" --disable-usage-stats", "")
                                         for c in broken["head_start_ray_commands"]]
    (line,) = refused(tmp_path, broken, "head_start_ray_commands")
    assert "--disable-usage-stats" in line


def test_outputs_in_a_synced_code_folder_or_inside_the_container_are_refused(tmp_path):
    broken = copy.deepcopy(CLUSTER)
    broken["file_mounts"]["~/cocolm-home"] = "."  # the old layout: the checkout where $COCOLM_HOME is
    (line,) = refused(tmp_path, broken, "file_mounts.~/cocolm-home")
    assert "copied to every new worker" in line
    broken = copy.deepcopy(CLUSTER)
    broken["docker"]["run_options"] = [o for o in broken["docker"]["run_options"] if not o.startswith("-v ")]
    refused(tmp_path, broken, "docker.run_options")


def test_an_mlflow_host_the_server_does_not_allow_is_refused(tmp_path):
    allowed = ["--mlflow-allowed-hosts", "mlflow.example.internal:5000"]
    refused(tmp_path, CLUSTER, "--tracking-uri", "--tracking-uri", "http://10.0.0.5:5000", *allowed)
    code, lines = run(tmp_path, CLUSTER, "--tracking-uri", "http://mlflow.example.internal:5000", *allowed)
    assert code == 0, lines


# ----------------------------------------------------------------------------------------- the RayJob's


def test_kuberays_crd_refuses_a_field_it_does_not_know(tmp_path):
    broken = copy.deepcopy(RAYJOB)
    broken["spec"]["rayClusterSpec"]["headGroupSpec"]["serviceTyp"] = "ClusterIP"
    (line,) = refused(tmp_path, broken, "spec.rayClusterSpec.headGroupSpec")
    assert "CRD (v1.5.1)" in line and "serviceTyp" in line
    broken = copy.deepcopy(RAYJOB)
    broken["spec"]["ttlSecondsAfterFinished"] = "an hour"
    refused(tmp_path, broken, "spec.ttlSecondsAfterFinished")


def test_the_rayjobs_latest_image_is_refused(tmp_path):
    broken = copy.deepcopy(RAYJOB)
    broken["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["image"] = "cocolm-ray:latest"
    refused(tmp_path, broken, "spec.rayClusterSpec.workerGroupSpecs[0].template.spec.containers[0].image")


def test_pods_without_a_service_account_cannot_reach_the_storage(tmp_path):
    broken = copy.deepcopy(RAYJOB)
    del broken["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"]["spec"]["serviceAccountName"]
    refused(tmp_path, broken, "spec.rayClusterSpec.workerGroupSpecs[0].template.spec.serviceAccountName")
    broken = copy.deepcopy(RAYJOB)
    broken["spec"]["entrypoint"] = broken["spec"]["entrypoint"].replace("s3://REPLACE-ME-BUCKET/cocolm/checkpoints", "/tmp/ckpt")
    refused(tmp_path, broken, "spec.entrypoint")


def test_the_rayjob_without_token_auth_or_exposed_is_refused(tmp_path):
    broken = copy.deepcopy(RAYJOB)
    del broken["spec"]["rayClusterSpec"]["authOptions"]
    refused(tmp_path, broken, "spec.rayClusterSpec.authOptions")
    broken = copy.deepcopy(RAYJOB)
    broken["spec"]["rayClusterSpec"]["headGroupSpec"]["serviceType"] = "LoadBalancer"
    refused(tmp_path, broken, "spec.rayClusterSpec.headGroupSpec.serviceType")


def test_an_mlflow_host_outside_the_manifests_allowed_hosts_is_refused(tmp_path):
    broken = copy.deepcopy(RAYJOB)
    broken["spec"]["entrypoint"] = broken["spec"]["entrypoint"].replace("mlflow.mlflow.svc.cluster.local", "mlflow.mlflow")
    (line,) = refused(tmp_path, broken, "spec.entrypoint")
    assert "mlflow.mlflow:5000" in line and "Invalid Host header" in line


def test_gpu_pods_kept_for_an_hour_and_literal_passwords_are_refused(tmp_path):
    broken = copy.deepcopy(RAYJOB)
    broken["spec"]["ttlSecondsAfterFinished"] = 3600
    refused(tmp_path, broken, "spec.ttlSecondsAfterFinished")
    broken = copy.deepcopy(RAYJOB)
    broken["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["env"][1] = {
        "name": "MLFLOW_TRACKING_PASSWORD", "value": "hunter2"}
    refused(tmp_path, broken, "spec.rayClusterSpec.headGroupSpec.template.spec.containers[0].env[1]")


def test_the_rayjobs_working_dir_is_where_the_image_holds_the_code(tmp_path):
    broken = copy.deepcopy(RAYJOB)
    broken["spec"]["runtimeEnvYAML"] = broken["spec"]["runtimeEnvYAML"].replace("working_dir: /app", "working_dir: /code")
    refused(tmp_path, broken, "spec.runtimeEnvYAML.working_dir")
    broken = copy.deepcopy(RAYJOB)
    broken["spec"]["rayClusterSpec"]["rayVersion"] = "2.59.0"
    refused(tmp_path, broken, "spec.rayClusterSpec.rayVersion")


# -------------------------------------------------------------------- the test data and the image's install


def test_the_kept_crd_is_kuberays_v1_5_1_file_with_its_licence():
    notes = (ROOT / "tests" / "fixtures" / "kuberay-crd" / "README.md").read_text()
    digest = hashlib.sha256(gzip.open(preflight.KUBERAY_CRD).read()).hexdigest()
    assert digest in notes and "v1.5.1" in notes and "v1.5.1" in preflight.KUBERAY_CRD.name
    assert "Apache License" in (ROOT / "tests" / "fixtures" / "kuberay-crd" / "LICENSE").read_text()


def test_requires_python_is_the_floor_of_the_pins_own_requirements():
    """The pins' own metadata say which Python they need (pandas 3.1.1, scipy 1.17.1, scikit-learn 1.9.1,
    transformers 5.23.0 need 3.11); requires-python says no less, and the image's Python satisfies it."""
    project = preflight.read_project()
    floors = []
    for line in dockerfile_pins():
        requirement = Requirement(line)
        try:
            requires = distribution(requirement.name).metadata.get("Requires-Python")
        except PackageNotFoundError:
            continue  # boto3 (the aws extra) where the test extra alone is installed
        floors += [s.version for s in SpecifierSet(requires or "") if s.operator == ">="]
    floor = max(floors, key=lambda v: tuple(int(x) for x in re.findall(r"\d+", v)[:2]))
    assert tuple(int(x) for x in floor.split(".")[:2]) == (3, 11)
    assert project.requires_python.contains("3.11") and not project.requires_python.contains("3.10")
    assert project.image_python == "3.11" and project.requires_python.contains(project.image_python)


def dockerfile_pins():
    """What the Dockerfile's first install step asks pip for: its own Python, run here against pyproject.toml."""
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    (step,) = [line for line in text.splitlines() if line.startswith("RUN python -c 'import sys, tomllib")]
    words = shlex.split(step[len("RUN "):].split(" > /tmp/pins.txt")[0])
    version = preflight.read_project().version
    result = subprocess.run([sys.executable, "-c", words[2], version], cwd=ROOT, capture_output=True, text=True,
                            check=True)
    refusal = subprocess.run([sys.executable, "-c", words[2], "9.9.9"], cwd=ROOT, capture_output=True, text=True)
    assert refusal.returncode != 0 and "tag the image with the project version" in refusal.stderr
    return result.stdout.split("\n")[:-1]


def test_the_dockerfile_installs_the_pins_ci_installs_in_python_3_11():
    """The image's install, as far as a machine without Docker goes: the same pinned requirements, resolved
    from pyproject.toml by the Dockerfile's own step, are what this Python 3.11 environment has installed."""
    assert sys.version_info[:2] >= (3, 11)
    pins = dockerfile_pins()
    assert "boto3==1.44.5" in pins and any(p.startswith("ray[") and p.endswith("==2.60.0") for p in pins)
    for line in pins:
        requirement = Requirement(line)
        try:
            installed = distribution(requirement.name).version
        except PackageNotFoundError:
            assert requirement.name == "boto3", line  # the aws extra: installed by `pip install -e '.[aws]'`
            continue
        assert requirement.specifier.contains(installed, prereleases=True), (line, installed)
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "pip install --no-cache-dir --no-deps -e /app" in dockerfile and "WORKDIR /app" in dockerfile
    assert ":latest" not in dockerfile and "latest" not in re.findall(r"^ARG RAY_BASE=(\S+)", dockerfile, re.M)[0]
    assert "ENV COCOLM_HOME=/home/ray/cocolm-home" in dockerfile and "RAY_USAGE_STATS_ENABLED=0" in dockerfile
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert {".git", ".venv", ".env", "*.private.yaml"} <= set(ignored)


def test_the_least_privilege_policies_scope_every_grant():
    """The node roles reach the two buckets (and the image) only; the head's EC2 rights need the cluster's tag."""
    import json

    storage = json.loads((ROOT / "platform" / "aws" / "node-storage-policy.json").read_text())
    for statement in storage["Statement"]:
        resources = statement["Resource"] if isinstance(statement["Resource"], list) else [statement["Resource"]]
        assert resources != ["*"] or statement["Action"] == "ecr:GetAuthorizationToken", statement
        assert all("*" not in str(a) for a in ([statement["Action"]] if isinstance(statement["Action"], str) else statement["Action"]))
    head = json.loads((ROOT / "platform" / "aws" / "head-autoscaler-policy.json").read_text())
    for statement in head["Statement"]:
        actions = [statement["Action"]] if isinstance(statement["Action"], str) else statement["Action"]
        if any(a in ("ec2:TerminateInstances", "ec2:StopInstances") for a in actions):
            assert statement["Condition"] == {"StringEquals": {"ec2:ResourceTag/ray-cluster-name": "${CLUSTER}"}}
        if statement["Resource"] == "*":
            assert all(a.startswith("ec2:Describe") for a in actions), statement
        assert not any(a.endswith(":*") or a == "*" for a in actions)
    (launch,) = [s for s in head["Statement"] if s["Action"] == "ec2:RunInstances" and "Condition" in s]
    assert launch["Condition"] == {"StringEquals": {"aws:RequestTag/ray-cluster-name": "${CLUSTER}"}}
    (passrole,) = [s for s in head["Statement"] if s["Action"] == "iam:PassRole"]
    assert passrole["Resource"].endswith(":role/${CLUSTER}-worker")
    setup = (ROOT / "platform" / "aws" / "setup.sh").read_text()
    assert "--cidr \"$SSH_CIDR\"" in setup and "0.0.0.0/*" in setup  # refuses SSH from everyone
    profiles = {t["node_config"]["IamInstanceProfile"]["Name"] for t in CLUSTER["available_node_types"].values()}
    assert profiles == {f"{CLUSTER['cluster_name']}-head", f"{CLUSTER['cluster_name']}-worker"}
    assert "--from-literal" not in (ROOT / "platform" / "kuberay" / "rayjob.yaml").read_text()
    assert pytest  # noqa: the module's fixtures come from pytest
