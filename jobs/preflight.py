"""Pre-flight: check a cluster launcher config or a KubeRay RayJob offline, before any node is paid for.

    python -m jobs.preflight [--strict] [--storage URI] [--tracking-uri URI] FILE [FILE ...]

FILE is a Ray cluster launcher config (`cluster.yaml`) or a KubeRay RayJob (`platform/kuberay/rayjob.yaml`),
told apart by its content. Each is checked against its own schema: Ray's validator for the launcher config
(the one `ray up` runs: ray.autoscaler._private.util.prepare_config + validate_config), KubeRay's RayJob CRD
(tests/fixtures/kuberay-crd, the oldest operator the platform supports) for a RayJob, unknown fields refused
as kubectl's strict validation does. Then the platform's own rules:

- python: every node runs an image whose Python satisfies pyproject.toml's requires-python (the floor of
  the pins); the project's image (Dockerfile) tagged with the project's version; no `latest` tag or
  untagged image (a moving target, pulled on every start);
- storage: every node type can reach --storage (an instance profile on each node type of a launcher config,
  a service account on each pod of a RayJob); a local path is on one node only;
- auth: Ray's token authentication on every node; SSH only from chosen addresses (no default security group,
  no rule open to 0.0.0.0/0); the head's instance profile not shared with the workers;
- dashboard: on the head's 127.0.0.1 (launcher config), not exposed beyond the cluster (RayJob);
- outputs: $COCOLM_HOME outside every folder synced to the nodes, and kept on the host's disk;
- telemetry: usage reporting off at the head's `ray start`, where Ray decides it;
- mlflow: the host of --tracking-uri among the MLflow server's --allowed-hosts (platform/mlflow/kubernetes.yaml
  for a server in Kubernetes, platform/mlflow/.env for the compose recipe), else MLflow answers 403;
- secrets: passwords and tokens only from Secrets, never as literal values.

Each problem is one line, `error: FILE: KEY: what is wrong; the fix`. A value the template leaves to you
(`REPLACE-ME`) is a `todo:` line; --strict makes it an error (run that right before `ray up` or
`kubectl apply`). Exit status 0 only when no error is left.
"""

from __future__ import annotations

import argparse
import gzip
import re
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import jsonschema
import yaml
from packaging.specifiers import SpecifierSet
from ray.autoscaler._private.util import prepare_config, validate_config

from jobs.cli import UserError
from jobs.config_reader import read_yaml

ROOT = Path(__file__).resolve().parent.parent
KUBERAY_CRD = ROOT / "tests" / "fixtures" / "kuberay-crd" / "ray.io_rayjobs-v1.5.1.yaml.gz"
MLFLOW_MANIFEST = ROOT / "platform" / "mlflow" / "kubernetes.yaml"
MLFLOW_ENV = ROOT / "platform" / "mlflow" / ".env"
PLACEHOLDER = "REPLACE-ME"
IMAGE_NAME = "cocolm-ray"  # the repository name the Dockerfile's image is pushed under
SECRET_WORDS = ("PASSWORD", "TOKEN", "SECRET", "ACCESS_KEY")
LOCALHOST = {"127.0.0.1", "localhost", "::1"}
MAX_GPU_TTL_S = 600  # how long a finished RayJob may keep its GPU pods


@dataclass
class Project:
    """What the checkout says: version, requires-python, the Ray pin, and the image the Dockerfile builds."""

    version: str
    requires_python: SpecifierSet
    ray_version: str
    image_python: str | None  # the Dockerfile's base image's Python, from its -py3XX tag
    image_home: str  # $HOME of the image (Ray's images: /home/ray)
    image_cocolm_home: str | None  # the Dockerfile's ENV COCOLM_HOME
    image_workdir: str | None


def read_project(root: Path = ROOT) -> Project:
    text = (root / "pyproject.toml").read_text(encoding="utf-8")
    version = re.search(r'^version = "([^"]+)"', text, re.MULTILINE).group(1)
    requires = re.search(r'^requires-python = "([^"]+)"', text, re.MULTILINE).group(1)
    ray = re.search(r'"ray\[[^\]]*\]==([\d.]+)"', text).group(1)
    try:
        dockerfile = (root / "Dockerfile").read_text(encoding="utf-8")
    except OSError:
        dockerfile = ""
    base = re.search(r"^ARG RAY_BASE=(\S+)", dockerfile, re.MULTILINE)
    python = image_python(base.group(1)) if base else None
    home = re.search(r"^ENV COCOLM_HOME=(\S+)", dockerfile, re.MULTILINE)
    workdir = re.findall(r"^WORKDIR (\S+)", dockerfile, re.MULTILINE)
    return Project(version, SpecifierSet(requires), ray, python, "/home/ray", home.group(1) if home else None,
                   workdir[-1] if workdir else None)


def image_python(reference: str) -> str | None:
    """The Python of an image whose tag says it, as Ray's images do: rayproject/ray:2.60.0-py311-gpu -> 3.11."""
    match = re.search(r":[^/]*-py3(\d+)", reference)
    return f"3.{match.group(1)}" if match else None


@dataclass
class Report:
    """The lines for one file: errors, and placeholders (errors too with --strict)."""

    file: str
    strict: bool
    errors: list[str] = field(default_factory=list)
    todos: list[str] = field(default_factory=list)

    def error(self, key: str, problem: str) -> None:
        self.errors.append(f"error: {self.file}: {key}: {problem}")

    def todo(self, key: str, problem: str) -> None:
        (self.errors if self.strict else self.todos).append(
            f"{'error' if self.strict else 'todo'}: {self.file}: {key}: {problem}")


def placeholders(node: Any, key: str = "") -> list[tuple[str, str]]:
    """(key, value) of every string that still holds the template's placeholder."""
    if isinstance(node, dict):
        return [found for k, v in node.items() for found in placeholders(v, f"{key}.{k}" if key else str(k))]
    if isinstance(node, list):
        return [found for i, v in enumerate(node) for found in placeholders(v, f"{key}[{i}]")]
    return [(key, node)] if isinstance(node, str) and PLACEHOLDER in node else []


def check_image(report: Report, key: str, reference: str, project: Project) -> None:
    """The python and tag rules for one image reference."""
    name, _, tag = reference.rpartition(":") if ":" in reference.rsplit("/", 1)[-1] else (reference, "", "")
    name = name.split("@")[0]
    if not tag or tag.split("@")[0] == "latest":
        report.error(key, f"{reference} has {'no tag' if not tag else 'the tag latest'}, which moves (and Kubernetes "
                          f"pulls it on every start); tag the project image with its version: "
                          f"{name or reference}:{project.version}")
        return
    tag = tag.split("@")[0]
    if name.rsplit("/", 1)[-1] == IMAGE_NAME:
        if tag != project.version:
            report.error(key, f"{reference} is not this checkout's image: pyproject.toml's version is "
                              f"{project.version}; build and push {name}:{project.version} (Dockerfile)")
        python = project.image_python
        where = "the Dockerfile's RAY_BASE"
    else:
        python = image_python(reference)
        where = reference
    if python is None:
        report.error(key, f"cannot tell which Python {reference} runs: use the project image "
                          f"(Dockerfile, tagged {IMAGE_NAME}:{project.version})")
    elif not project.requires_python.contains(python):
        report.error(key, f"{where} runs Python {python}, but the pins need {project.requires_python} "
                          f"(pyproject.toml's requires-python): build the image on a py311 base")


def check_tracking_uri(report: Report, key: str, uri: str | None, allowed: list[str] | None, source: str) -> None:
    """The MLflow host rule: the host:port a job sends must be one the server allows."""
    if not uri:
        return
    parsed = urlparse(uri)
    if parsed.scheme not in ("http", "https"):
        return
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    host = f"{parsed.hostname}:{port}"
    if allowed is None:
        report.todo(key, f"cannot tell whether the MLflow server allows {host}: give --mlflow-allowed-hosts, or "
                         f"keep its list in {source}")
    elif host not in allowed and parsed.hostname not in allowed and "*" not in allowed:
        report.error(key, f"{host} is not among the MLflow server's --allowed-hosts ({', '.join(allowed) or 'none'}, "
                          f"{source}): MLflow answers 403 'Invalid Host header'; add {host} there")


def manifest_allowed_hosts(path: Path = MLFLOW_MANIFEST) -> list[str] | None:
    """The --allowed-hosts of the MLflow server's Kubernetes manifest (its container's MLFLOW_ALLOWED_HOSTS)."""
    try:
        documents = list(yaml.safe_load_all(path.read_text(encoding="utf-8")))
    except OSError:
        return None
    for document in documents:
        if (document or {}).get("kind") != "Deployment":
            continue
        for container in document["spec"]["template"]["spec"]["containers"]:
            for env in container.get("env", []):
                if env.get("name") == "MLFLOW_ALLOWED_HOSTS" and "value" in env:
                    return [h.strip() for h in env["value"].split(",") if h.strip()]
    return None


def env_file_allowed_hosts(path: Path = MLFLOW_ENV) -> list[str] | None:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return None
    match = re.search(r"^MLFLOW_ALLOWED_HOSTS=(.*)$", text, re.MULTILINE)
    return [h.strip() for h in match.group(1).split(",") if h.strip()] if match else None


def check_storage_uri(report: Report, key: str, storage: str | None, shared_fs: bool, cloud: str) -> str | None:
    """The scheme of --storage: 's3'/'gs' for object storage, None when there is nothing more to check."""
    if storage is None:
        return None
    scheme = urlparse(storage).scheme
    if scheme in ("s3", "gs"):
        if scheme != cloud:
            report.error(key, f"--storage {storage}: the nodes' credentials are for {cloud}:// "
                              f"(no {scheme} credentials on them); use {cloud}://BUCKET/...")
            return None
        return scheme
    if scheme in ("", "file") and not shared_fs:
        report.error(key, f"--storage {storage} is a path on one node's own disk: the other nodes cannot write "
                          f"their checkpoints there; use {cloud}://BUCKET/... (or a file system mounted on "
                          f"every node, then pass --shared-fs)")
    return None


# ----------------------------------------------------------------------------------------- cluster launcher


def ray_start_commands(config: dict[str, Any], key: str) -> list[str]:
    return [c for c in config.get(key) or [] if "ray start" in c]


def flag_value(command: str, flag: str) -> str | None:
    """The value of --flag=value or --flag value in a shell command line."""
    try:
        words = shlex.split(command)
    except ValueError:
        words = command.split()
    for i, word in enumerate(words):
        if word.startswith(flag + "="):
            return word.split("=", 1)[1]
        if word == flag and i + 1 < len(words):
            return words[i + 1]
    return None


def docker_env(docker: dict[str, Any]) -> dict[str, str]:
    """The --env NAME=VALUE / -e NAME=VALUE of docker.run_options (and head/worker run options)."""
    env = {}
    options = [o for k in ("run_options", "head_run_options", "worker_run_options") for o in docker.get(k) or []]
    words = [w for option in options for w in shlex.split(str(option))]
    for i, word in enumerate(words):
        if word in ("--env", "-e") and i + 1 < len(words) and "=" in words[i + 1]:
            name, value = words[i + 1].split("=", 1)
            env[name] = value
        elif word.startswith("--env=") and "=" in word[6:]:
            name, value = word[6:].split("=", 1)
            env[name] = value
    return env


def docker_binds(docker: dict[str, Any]) -> dict[str, str]:
    """container path -> host path of the -v/--volume binds in docker.run_options."""
    options = [o for k in ("run_options", "head_run_options", "worker_run_options") for o in docker.get(k) or []]
    words = [w for option in options for w in shlex.split(str(option))]
    binds = {}
    for i, word in enumerate(words):
        spec = words[i + 1] if word in ("-v", "--volume") and i + 1 < len(words) else (
            word.split("=", 1)[1] if word.startswith("--volume=") else None)
        if spec and ":" in spec:
            host, container = spec.split(":")[:2]
            binds[container.rstrip("/")] = host
    return binds


def expand_home(path: str, home: str) -> str:
    return home + path[1:] if path == "~" or path.startswith("~/") else path


def inside(path: str, folder: str) -> bool:
    path, folder = path.rstrip("/"), folder.rstrip("/")
    return path == folder or path.startswith(folder + "/")


def check_cluster(report: Report, config: dict[str, Any], project: Project, opts: argparse.Namespace) -> None:
    # Ray's own validation, as `ray up` runs it.
    try:
        prepared = prepare_config(config)
        validate_config(prepared)
    except jsonschema.ValidationError as error:
        key = ".".join(str(p) for p in error.absolute_path) or "(top)"
        report.error(key, f"Ray's schema refuses it: {error.message}; see ray/autoscaler/ray-schema.json")
        return
    except (ValueError, RuntimeError, KeyError, TypeError) as error:
        report.error("(top)", f"Ray's validator refuses it: {error}")
        return

    for key, value in placeholders(config):
        report.todo(key, f"{value} is the template's placeholder: fill in yours (docs/cluster.md)")

    provider = config.get("provider") or {}
    cloud = {"aws": "s3", "gcp": "gs"}.get(provider.get("type"), provider.get("type"))
    node_types = config.get("available_node_types") or {}
    head_type = config.get("head_node_type")
    docker = config.get("docker") or {}
    env = docker_env(docker)

    # python: the project's image on every node; without docker, the AMI's python3 runs the pins.
    images = {k: docker[k] for k in ("image", "head_image", "worker_image") if docker.get(k)}
    if not images:
        report.error("docker.image", f"missing: every node would install the pins with its AMI's python3 (Ubuntu "
                                     f"22.04's is 3.10; they need {project.requires_python}); run the project "
                                     f"image: docker: {{image: REGISTRY/{IMAGE_NAME}:{project.version}}} (Dockerfile)")
    for key, reference in images.items():
        check_image(report, f"docker.{key}", reference, project)
    home = project.image_home
    for key in ("setup_commands", "head_setup_commands", "worker_setup_commands"):
        for command in config.get(key) or []:
            if re.search(r"\bpip3? install\b", command):
                report.error(key, f"`{command}` installs packages when a node starts (with whatever Python and "
                                  f"index it finds): put them in the image (Dockerfile) instead")
    if "head_setup_commands" not in config:
        report.error("head_setup_commands", "missing: Ray's default pip-installs an unpinned boto3 on the head; set "
                                            "head_setup_commands: [] (the image has boto3, the aws extra)")

    # storage and SSH: each node type's own instance profile and the chosen security group.
    worker_profiles = [t.get("node_config", {}).get("IamInstanceProfile") for n, t in node_types.items() if n != head_type]
    for name, node_type in node_types.items():
        node_config = node_type.get("node_config") or {}
        key = f"available_node_types.{name}.node_config"
        if provider.get("type") == "aws":
            if not node_config.get("IamInstanceProfile"):
                report.error(f"{key}.IamInstanceProfile",
                             "missing: this node type gets no credentials (Ray gives only the head a role, with EC2 "
                             "and S3 full access), so it cannot reach --storage s3://...; set {Name: "
                             + f"{config.get('cluster_name')}-{'head' if name == head_type else 'worker'}" + "} "
                             "(platform/aws/setup.sh makes it)")
            elif name == head_type and node_config["IamInstanceProfile"] in worker_profiles:
                report.error(f"{key}.IamInstanceProfile", "the head's profile (which may start and stop instances) is "
                                                          "shared with a worker type: give workers their own "
                                                          f"({config.get('cluster_name')}-worker)")
            if not node_config.get("SecurityGroupIds"):
                report.error(f"{key}.SecurityGroupIds",
                             "missing: Ray then creates its default group, which opens SSH to 0.0.0.0/0; name the "
                             "group platform/aws/setup.sh made (SSH from your address only)")
    for i, rule in enumerate((provider.get("security_group") or {}).get("IpPermissions") or []):
        ranges = [r.get("CidrIp") for r in rule.get("IpRanges", [])] + [r.get("CidrIpv6") for r in rule.get("Ipv6Ranges", [])]
        if any(r in ("0.0.0.0/0", "::/0") for r in ranges):
            report.error(f"provider.security_group.IpPermissions[{i}]", "open to every address: allow your own "
                                                                        "(/32) only")
    scheme = check_storage_uri(report, "--storage", opts.storage, opts.shared_fs, cloud)
    if scheme is None and opts.storage is None:
        report.todos.append(f"note: {report.file}: --storage: not given, so the storage rule checked only that every "
                            "node type has credentials; pass the --storage s3://... your jobs will use")

    # token auth on every node, the dashboard on the head's 127.0.0.1, usage reporting off at ray start.
    starts = {key: ray_start_commands(config, key) for key in ("head_start_ray_commands", "worker_start_ray_commands")}
    everything = " ".join(str(c) for k in ("setup_commands", "head_setup_commands", "worker_setup_commands",
                                           "initialization_commands", "head_start_ray_commands",
                                           "worker_start_ray_commands") for c in config.get(k) or [])
    if "RAY_AUTH_MODE=disabled" in everything or env.get("RAY_AUTH_MODE") == "disabled":
        report.error("RAY_AUTH_MODE", "disabled: anyone who reaches a node's ports runs code there; never disable it")
    for key, commands in starts.items():
        if not commands:
            report.error(key, "no `ray start`: this node type would never join")
        for command in commands:
            if "RAY_AUTH_MODE=token" not in command and env.get("RAY_AUTH_MODE") != "token":
                report.error(key, "`ray start` without RAY_AUTH_MODE=token runs an open cluster: write "
                                  "RAY_AUTH_MODE=token ray start ... (or docker run_options --env RAY_AUTH_MODE=token)")
    if not any(remote.endswith(".ray/auth_token") for remote in (config.get("file_mounts") or {})):
        report.error("file_mounts", "no Ray token goes to the nodes: add ~/.ray/auth_token: ~/.ray/cocolm-cluster-token")
    for remote, local in (config.get("file_mounts") or {}).items():
        if remote.endswith(".ray/auth_token") and inside(str(Path(local).expanduser().resolve()), str(ROOT)):
            report.error(f"file_mounts.{remote}", f"the token comes from {local}, inside the repository: keep it in "
                                                  "~/.ray/ (owner-only), never where git or rsync can take it")
    for command in starts["head_start_ray_commands"]:
        host = flag_value(command, "--dashboard-host")
        if host not in LOCALHOST:
            report.error("head_start_ray_commands", f"the dashboard (and its job API) listens on "
                                                    f"{host or 'an address Ray picks'}: add --dashboard-host=127.0.0.1 "
                                                    "and reach it with `ray dashboard cluster.yaml` (SSH)")
        if ("--disable-usage-stats" not in command and "RAY_USAGE_STATS_ENABLED=0" not in command
                and env.get("RAY_USAGE_STATS_ENABLED") != "0"):
            report.error("head_start_ray_commands", "usage reporting is decided at the head's `ray start` (a runtime "
                                                    "env cannot turn it off): add --disable-usage-stats")

    # outputs apart from code, kept on the host's disk.
    cocolm_home = env.get("COCOLM_HOME") or project.image_cocolm_home or "~/cocolm-ray"
    cocolm_home = expand_home(cocolm_home, home)
    for remote, local in (config.get("file_mounts") or {}).items():
        target = expand_home(remote, home)
        if inside(cocolm_home, target) or inside(target, cocolm_home):
            report.error(f"file_mounts.{remote}", f"{remote} (from {local}) and $COCOLM_HOME {cocolm_home} overlap: "
                                                  "outputs (ray_results/, locks) land in a synced folder and are "
                                                  "copied to every new worker; sync code elsewhere, or not at all "
                                                  "(jobs.submit ships it)")
    if images and not any(inside(cocolm_home, c) for c in docker_binds(docker)):
        report.error("docker.run_options", f"$COCOLM_HOME {cocolm_home} is inside the container, lost whenever Ray "
                                           f"replaces it: add -v /home/{(config.get('auth') or {}).get('ssh_user', 'ubuntu')}"
                                           f"/cocolm-home:{cocolm_home}")

    allowed = opts.mlflow_allowed_hosts.split(",") if opts.mlflow_allowed_hosts else env_file_allowed_hosts()
    check_tracking_uri(report, "--tracking-uri", opts.tracking_uri, allowed, "platform/mlflow/.env")


# ----------------------------------------------------------------------------------------------- RayJob


def strict_schema(schema: Any) -> Any:
    """The CRD's schema with unknown fields refused (additionalProperties: false where it lists properties),
    as the API server's strict field validation (kubectl's default) refuses them."""
    if isinstance(schema, dict):
        schema = {k: strict_schema(v) for k, v in schema.items()}
        if ("properties" in schema and "additionalProperties" not in schema
                and not schema.get("x-kubernetes-preserve-unknown-fields")):
            schema["additionalProperties"] = False
        return schema
    if isinstance(schema, list):
        return [strict_schema(v) for v in schema]
    return schema


def rayjob_schema(crd_path: Path = KUBERAY_CRD) -> dict[str, Any]:
    try:
        with gzip.open(crd_path, "rt", encoding="utf-8") as f:
            crd = yaml.load(f, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except OSError as error:
        raise UserError(f"cannot read KubeRay's RayJob CRD {crd_path}: {error}") from error
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    schema = strict_schema(version["schema"]["openAPIV3Schema"])
    schema["properties"]["metadata"] = {"type": "object", "required": ["name"]}
    return schema


def entrypoint_option(entrypoint: str, flag: str) -> str | None:
    return flag_value(entrypoint or "", flag)


def pod_groups(spec: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    cluster = spec.get("rayClusterSpec") or {}
    groups = [("spec.rayClusterSpec.headGroupSpec", cluster.get("headGroupSpec") or {})]
    groups += [(f"spec.rayClusterSpec.workerGroupSpecs[{i}]", g) for i, g in enumerate(cluster.get("workerGroupSpecs") or [])]
    return groups


def check_rayjob(report: Report, job: dict[str, Any], project: Project, opts: argparse.Namespace,
                 schema: dict[str, Any]) -> None:
    problems = sorted(jsonschema.Draft7Validator(schema).iter_errors(job), key=lambda e: list(e.absolute_path))
    for error in problems:
        key = ".".join(str(p) for p in error.absolute_path) or "(top)"
        report.error(key, f"KubeRay's RayJob CRD (v1.5.1) refuses it: {error.message}")
    if problems:
        return
    for key, value in placeholders(job):
        report.todo(key, f"{value} is the template's placeholder: fill in yours (docs/cluster.md)")

    spec = job["spec"]
    cluster = spec.get("rayClusterSpec") or {}
    if spec.get("clusterSelector"):
        report.error("spec.clusterSelector", "the job runs on a RayCluster this file does not describe: the "
                                             "pre-flight cannot check it; describe it in rayClusterSpec")
        return
    if cluster.get("rayVersion") != project.ray_version:
        report.error("spec.rayClusterSpec.rayVersion", f"{cluster.get('rayVersion')} is not the pinned Ray "
                                                       f"{project.ray_version} (pyproject.toml): set \"{project.ray_version}\"")
    entrypoint = spec.get("entrypoint") or ""
    try:
        runtime_env = yaml.safe_load(spec.get("runtimeEnvYAML") or "") or {}
    except yaml.YAMLError as error:
        report.error("spec.runtimeEnvYAML", f"not YAML: {error}")
        runtime_env = {}
    if not isinstance(runtime_env, dict):
        report.error("spec.runtimeEnvYAML", "must be a mapping (working_dir:, env_vars:, ...)")
        runtime_env = {}

    # python and tags: every container's image.
    containers = []
    for key, group in pod_groups(spec):
        pod = (group.get("template") or {}).get("spec") or {}
        for i, container in enumerate(pod.get("containers") or []):
            containers.append((f"{key}.template.spec.containers[{i}]", container))
    project_image = True
    for key, container in containers:
        check_image(report, f"{key}.image", container.get("image", ""), project)
        project_image &= container.get("image", "").split("@")[0].rsplit(":", 1)[0].rsplit("/", 1)[-1] == IMAGE_NAME
        if container.get("imagePullPolicy") == "Always":
            report.error(f"{key}.imagePullPolicy", "Always pulls on every start though the tag never moves: IfNotPresent")
        for j, env in enumerate(container.get("env") or []):
            if any(word in env.get("name", "") for word in SECRET_WORDS) and "value" in env:
                report.error(f"{key}.env[{j}]", f"{env['name']} is a literal value in the file: take it from a "
                                                "Secret made from files (valueFrom.secretKeyRef)")
            if env.get("name") == "RAY_AUTH_MODE" and env.get("value") == "disabled":
                report.error(f"{key}.env[{j}]", "RAY_AUTH_MODE=disabled: never disable Ray's token authentication")
    if project_image and project.image_workdir and runtime_env.get("working_dir") not in (None, project.image_workdir):
        report.error("spec.runtimeEnvYAML.working_dir", f"{runtime_env.get('working_dir')} is not where the image "
                                                        f"holds the code ({project.image_workdir}, the Dockerfile's "
                                                        "WORKDIR)")

    # storage: every pod reaches it, through its service account (workload identity), never a key.
    storage = entrypoint_option(entrypoint, "--storage") or opts.storage
    if storage is None:
        report.error("spec.entrypoint", "no --storage: checkpoints would go to the head pod's own disk, gone with "
                                        "the pod; add --storage s3://BUCKET/...")
    scheme = check_storage_uri(report, "spec.entrypoint", storage, opts.shared_fs,
                               urlparse(storage or "").scheme if urlparse(storage or "").scheme in ("s3", "gs") else "s3")
    if scheme:
        for key, group in pod_groups(spec):
            pod = (group.get("template") or {}).get("spec") or {}
            if not pod.get("serviceAccountName"):
                report.error(f"{key}.template.spec.serviceAccountName",
                             f"missing: these pods get no credentials for --storage {storage}; run them as the "
                             "service account cocolm-ray (platform/kuberay/serviceaccount.yaml)")

    # token auth, nothing exposed beyond the cluster, usage reporting off at ray start.
    if (cluster.get("authOptions") or {}).get("mode") != "token":
        report.error("spec.rayClusterSpec.authOptions", "Ray's token authentication is off: set authOptions: "
                                                        "{mode: token} (KubeRay 1.5.1 or newer)")
    head = cluster.get("headGroupSpec") or {}
    if head.get("serviceType", "ClusterIP") != "ClusterIP":
        report.error("spec.rayClusterSpec.headGroupSpec.serviceType", f"{head['serviceType']} exposes the dashboard "
                                                                      "and job API beyond the cluster: ClusterIP, and "
                                                                      "kubectl port-forward to look at it")
    if cluster.get("enableIngress"):
        report.error("spec.rayClusterSpec.enableIngress", "an Ingress exposes the dashboard beyond the cluster: remove it")
    params = head.get("rayStartParams") or {}
    head_env = {e.get("name"): e.get("value") for _, c in containers[:1] for e in c.get("env") or []}
    if (str(params.get("disable-usage-stats", "")).lower() != "true" and head_env.get("RAY_USAGE_STATS_ENABLED") != "0"
            and not project_image):
        report.error("spec.rayClusterSpec.headGroupSpec.rayStartParams", "usage reporting is decided at the head's "
                                                                         "`ray start`: add disable-usage-stats: \"true\"")

    # a finished job gives its GPUs back.
    gpus = any("nvidia.com/gpu" in ((c.get("resources") or {}).get("limits") or {}) for _, c in containers)
    ttl = spec.get("ttlSecondsAfterFinished", 0)
    if gpus and spec.get("shutdownAfterJobFinishes") and ttl > MAX_GPU_TTL_S:
        report.error("spec.ttlSecondsAfterFinished", f"{ttl} s keeps the GPU pods after the job ends: at most "
                                                     f"{MAX_GPU_TTL_S} (0 here: the RayJob keeps the submitter's logs)")
    if gpus and not spec.get("shutdownAfterJobFinishes"):
        report.error("spec.shutdownAfterJobFinishes", "false keeps the GPU pods after the job ends: set true")

    allowed = opts.mlflow_allowed_hosts.split(",") if opts.mlflow_allowed_hosts else manifest_allowed_hosts()
    check_tracking_uri(report, "spec.entrypoint", entrypoint_option(entrypoint, "--tracking-uri") or opts.tracking_uri,
                       allowed, "platform/mlflow/kubernetes.yaml")


# ------------------------------------------------------------------------------------------------- main


def check_file(path: Path, project: Project, opts: argparse.Namespace) -> Report:
    report = Report(str(path), opts.strict)
    document = read_yaml(path)
    if not isinstance(document, dict):
        report.error("(top)", "not a mapping: give a cluster launcher config or a KubeRay RayJob")
    elif document.get("kind") == "RayJob":
        check_rayjob(report, document, project, opts, rayjob_schema())
    elif "provider" in document or "available_node_types" in document:
        check_cluster(report, document, project, opts)
    else:
        report.error("(top)", f"neither a cluster launcher config (provider:, available_node_types:) nor a RayJob "
                              f"(kind: RayJob, kind is {document.get('kind')!r})")
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jobs.preflight", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="+", metavar="FILE", help="cluster.yaml or a RayJob YAML")
    parser.add_argument("--strict", action="store_true", help="placeholders (REPLACE-ME) are errors too")
    parser.add_argument("--storage", help="the --storage your jobs use (a RayJob's entrypoint names its own)")
    parser.add_argument("--tracking-uri", help="the --tracking-uri your jobs use (a RayJob's entrypoint names its own)")
    parser.add_argument("--mlflow-allowed-hosts", help="the MLflow server's --allowed-hosts, comma-separated "
                                                       "(default: platform/mlflow/kubernetes.yaml or .env)")
    parser.add_argument("--shared-fs", action="store_true",
                        help="a local --storage path is a file system mounted on every node")
    opts = parser.parse_args(argv)
    project = read_project()
    failed = False
    for name in opts.files:
        try:
            report = check_file(Path(name), project, opts)
        except UserError as error:
            print(f"error: {error}")
            failed = True
            continue
        for line in report.errors + report.todos:
            print(line)
        failed |= bool(report.errors)
        if not report.errors:
            print(f"ok: {name}" + (f" ({sum(1 for t in report.todos if t.startswith('todo'))} placeholders to fill "
                                   "before launch; --strict refuses them)" if any(t.startswith("todo") for t in report.todos) else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
