#!/usr/bin/env bash
# GPU validation job (GitHub Actions and Buildkite run this inside vLLM's own image for the pin,
# CUDA or ROCm): install vllm-patchset, prove every patch red/green on pure-Python trees, then
# apply and verify the overlay on the image's real vLLM build and run tests/gpu against it.
#
# GPU_VALIDATION_DRY_RUN=1: the steps up to the GPU only, as the CPU suite runs them
# (tests/test_gpu_jobs.py), so that a broken job shows before a runner exists: no install (the
# caller's environment has the tool), the image's pin, `check` and the trees built
# (`validate --build-only`); then it stops before the first GPU step. (The offline bundle is
# no step of these jobs: `bundle` builds the same trees, and the suite tests it elsewhere.)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
DRY=${GPU_VALIDATION_DRY_RUN:-0}
PIN=$("$PY" -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["tool"]["vllm-patchset"]["pin"])')
patchset() { "$PY" -m vllm_patchset "$@"; }

if [[ "$DRY" != 1 ]]; then
  "$PY" -m pip install --quiet -e '.[dev]'
fi
# The image's vllm from its metadata: no import of vllm itself (a CPU dry run reads it too).
installed=$("$PY" -c 'import importlib.metadata as m; print(m.version("vllm"))')
if [[ "$installed" != "$PIN" ]]; then
  echo "this image holds vllm $installed, the pin is $PIN" >&2
  exit 2
fi

patchset check

if [[ "$DRY" == 1 ]]; then
  patchset validate --work build/gpu-validate --build-only
  echo "dry run: vllm $installed is the pin; check and trees done; stopped before the GPU"
  exit 0
fi
"$PY" -c 'import torch; assert torch.cuda.is_available(), "no GPU visible"; print(torch.cuda.get_device_name(), "hip" if torch.version.hip else "cuda")'

# 1. Red/green per patch: pristine and overlaid pin, and each upstreamed fix on the release
#    that merged it with the fix reversed (a faithful nightly). Pure-Python trees: the tests
#    run vLLM's Python/Triton code with capture-safe stand-ins for its few compiled ops.
patchset validate --work build/gpu-validate

# 2. The overlay on the image's real vLLM: apply, verify, and the tests with the real ops.
patchset overlay apply
patchset overlay verify
VLLM_PATCHSET_GPU_REPORT=build/gpu-installed.json \
  "$PY" -m pytest tests/gpu --confcutdir tests/gpu -p no:cacheprovider -rA
grep -q '"mode": "native"' build/gpu-installed.json || { echo "tests/gpu did not run natively" >&2; exit 1; }
