# The one image of the project: every node of cluster.yaml (Ray's `docker:` section) and every container of
# platform/kuberay/rayjob.yaml run it; anyone else may too. Ray's own CUDA image for the pinned Ray and Python
# 3.11 (requires-python), plus the pinned project (pyproject.toml, and its `aws` extra for the autoscaler),
# installed once at build time: no node installs anything when it starts. Build it from the repository's root,
# tagged with the project's version (never `latest`: a moving tag that Kubernetes pulls on every start):
#   docker build -t REGISTRY/cocolm-ray:0.1.0 --build-arg COCOLM_VERSION=0.1.0 \
#     --build-arg COCOLM_GIT_COMMIT=$(git describe --always --dirty --abbrev=40) .
#   docker push REGISTRY/cocolm-ray:0.1.0
# (docs/cluster.md; `python -m jobs.preflight` checks that the files name this tag.) Pin the base by digest
# where you can pull it: --build-arg RAY_BASE=rayproject/ray:2.60.0-py311-gpu@sha256:...
ARG RAY_BASE=rayproject/ray:2.60.0-py311-gpu
FROM ${RAY_BASE}

# The version this image is tagged with; the build refuses one that is not pyproject.toml's.
ARG COCOLM_VERSION
ARG COCOLM_GIT_COMMIT=unknown

# The code lives in /app (the RayJob's working_dir), outputs outside it ($COCOLM_HOME: embedded MLflow store,
# local checkpoints, locks), so they are never shipped with the code nor copied to other nodes.
USER root
RUN mkdir -p /app /home/ray/cocolm-home && chown ray:users /app /home/ray/cocolm-home && chmod 700 /home/ray/cocolm-home
USER ray
WORKDIR /app
ENV COCOLM_HOME=/home/ray/cocolm-home \
    COCOLM_GIT_COMMIT=${COCOLM_GIT_COMMIT} \
    RAY_USAGE_STATS_ENABLED=0 \
    HF_HUB_OFFLINE=1 \
    MLFLOW_DISABLE_TELEMETRY=true \
    TOKENIZERS_PARALLELISM=false

# 1. The pinned dependencies, from pyproject.toml alone (this layer is rebuilt only when it changes): the
#    `dependencies` and the `aws` extra, exactly as written there. tests/test_preflight.py runs this same
#    step's Python against pyproject.toml, and CI installs the same pins in Python 3.11.
COPY --chown=ray:users pyproject.toml /app/pyproject.toml
RUN python -c 'import sys, tomllib; p = tomllib.load(open("pyproject.toml", "rb"))["project"]; sys.argv[1] == p["version"] or sys.exit("COCOLM_VERSION=%r, but pyproject.toml says %s: tag the image with the project version" % (sys.argv[1], p["version"])); print("\n".join(p["dependencies"] + p["optional-dependencies"]["aws"]))' "${COCOLM_VERSION}" > /tmp/pins.txt \
    && pip install --no-cache-dir -r /tmp/pins.txt \
    && python -c 'import sys; from importlib.metadata import version; from packaging.requirements import Requirement; bad = [f"{r.name} {version(r.name)} is not {r.specifier}" for r in map(Requirement, open(sys.argv[1]).read().splitlines()) if not r.specifier.contains(version(r.name), prereleases=True)]; sys.exit("; ".join(bad)) if bad else print("pins installed")' /tmp/pins.txt \
    && rm /tmp/pins.txt

# 2. The project itself (editable, so platform/ presets and grids sit beside the code), no dependency resolved
#    again.
COPY --chown=ray:users . /app
RUN pip install --no-cache-dir --no-deps -e /app \
    && python -c 'import sys; assert sys.version_info >= (3, 11), sys.version; import jobs, model'
