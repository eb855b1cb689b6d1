#!/bin/sh
# The MLflow container's start (Dockerfile): the artifact bucket, made once, then the server. Secrets come
# from the environment (docker-compose.yaml, from .env), never from this file or a command line.
set -eu
python - <<'PY'
import os
import time

import boto3
from botocore.exceptions import BotoCoreError, ClientError

s3 = boto3.client("s3", endpoint_url=os.environ["MLFLOW_S3_ENDPOINT_URL"])
for attempt in range(60):  # MinIO may still be starting
    try:
        if "mlflow-artifacts" not in [b["Name"] for b in s3.list_buckets()["Buckets"]]:
            s3.create_bucket(Bucket="mlflow-artifacts")
        break
    except (BotoCoreError, ClientError) as error:
        last = error
        time.sleep(1)
else:
    raise SystemExit(f"cannot reach MinIO to make the bucket mlflow-artifacts: {last}")
PY
exec mlflow server --host 0.0.0.0 --port 5000 --app-name basic-auth --allowed-hosts "$MLFLOW_ALLOWED_HOSTS" \
  --backend-store-uri postgresql://mlflow@postgres:5432/mlflow \
  --artifacts-destination s3://mlflow-artifacts --serve-artifacts
