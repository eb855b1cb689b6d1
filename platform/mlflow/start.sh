#!/bin/sh
# The MLflow container's start (Dockerfile): the artifact bucket, made once when the store is MinIO, then the
# server. Secrets come from the environment (docker-compose.yaml from .env; kubernetes.yaml from a Secret made
# from files), never from this file or a command line. The stores default to the compose recipe's:
#   MLFLOW_BACKEND_STORE_URI      postgresql://mlflow@postgres:5432/mlflow   (password: PGPASSWORD, read by libpq)
#   MLFLOW_ARTIFACTS_DESTINATION  s3://mlflow-artifacts                        (MinIO when MLFLOW_S3_ENDPOINT_URL is set)
set -eu
: "${MLFLOW_BACKEND_STORE_URI:=postgresql://mlflow@postgres:5432/mlflow}"
: "${MLFLOW_ARTIFACTS_DESTINATION:=s3://mlflow-artifacts}"
if [ -n "${MLFLOW_S3_ENDPOINT_URL:-}" ]; then
python - <<'PY'
import os
import time

import boto3
from botocore.exceptions import BotoCoreError, ClientError

bucket = os.environ.get("MLFLOW_ARTIFACTS_DESTINATION", "s3://mlflow-artifacts").removeprefix("s3://").split("/")[0]
s3 = boto3.client("s3", endpoint_url=os.environ["MLFLOW_S3_ENDPOINT_URL"])
for attempt in range(60):  # MinIO may still be starting
    try:
        if bucket not in [b["Name"] for b in s3.list_buckets()["Buckets"]]:
            s3.create_bucket(Bucket=bucket)
        break
    except (BotoCoreError, ClientError) as error:
        last = error
        time.sleep(1)
else:
    raise SystemExit(f"cannot reach MinIO to make the bucket {bucket}: {last}")
PY
fi
exec mlflow server --host 0.0.0.0 --port 5000 --app-name basic-auth --allowed-hosts "$MLFLOW_ALLOWED_HOSTS" \
  --backend-store-uri "$MLFLOW_BACKEND_STORE_URI" \
  --artifacts-destination "$MLFLOW_ARTIFACTS_DESTINATION" --serve-artifacts
