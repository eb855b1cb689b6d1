#!/usr/bin/env bash
# What the test suite needs from the operating system, installed when missing (Debian or Ubuntu):
#   chromium  renders the MLflow UI pages in tests/test_mlflow_ui.py
#   g++       torch.compile's CPU backend (inductor) builds C++: the 2-worker pretraining test compiles
# The README's test command runs this first, so it passes as written on a machine with only Python.
set -euo pipefail
missing=()
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v g++ >/dev/null 2>&1 || missing+=(g++)
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
sudo=""
if [ "$(id -u)" -ne 0 ]; then
  sudo="sudo"
fi
echo "+ installing ${missing[*]} for the tests (apt-get)"
$sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq
$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
