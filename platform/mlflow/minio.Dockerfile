# MinIO for the compose recipe, built from its source at the release that fixes CVE-2025-62506 (a restricted
# service or STS account's session policy could be bypassed when it made new service accounts; fixed in
# RELEASE.2025-10-15T17-29-55Z). MinIO publishes its community edition as source only since that autumn: the
# last image it published, RELEASE.2025-09-07T16-13-09Z, predates the fix. Built by `docker compose build`
# (docker-compose.yaml), both bases pinned by digest from .env; it runs as a user without root.
ARG GO_BASE
ARG RUNTIME_BASE
FROM ${GO_BASE} AS build
ARG MINIO_RELEASE=RELEASE.2025-10-15T17-29-55Z
# GOTOOLCHAIN=auto fetches the Go release MinIO's go.mod asks for, if the base's is older.
ENV CGO_ENABLED=0 GOTOOLCHAIN=auto
RUN git clone --depth 1 --branch "${MINIO_RELEASE}" https://github.com/minio/minio /src \
    && cd /src && go build -trimpath -o /out/minio . \
    && mkdir -p /out/data
FROM ${RUNTIME_BASE}
COPY --from=build /out/minio /usr/local/bin/minio
COPY --from=build --chown=65532:65532 /out/data /data
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/minio"]
