#!/usr/bin/env bash
# GPU validation job (GitHub Actions and Buildkite run this inside vLLM's own image for the pin,
# CUDA or ROCm): install vllm-patchset, prove every patch red/green on pure-Python trees, then
# apply and verify the overlay on the image's real vLLM build and run tests/gpu against it.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
PIN=$("$PY" -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["tool"]["vllm-patchset"]["pin"])')

"$PY" -m pip install --quiet -e '.[dev]'
installed=$("$PY" -c 'import vllm; print(vllm.__version__)')
if [[ "$installed" != "$PIN" ]]; then
  echo "this image holds vllm $installed, the pin is $PIN" >&2
  exit 2
fi
"$PY" -c 'import torch; assert torch.cuda.is_available(), "no GPU visible"; print(torch.cuda.get_device_name(), "hip" if torch.version.hip else "cuda")'

vllm-patchset check

# 1. Red/green per patch: pristine and overlaid pin, and each upstreamed fix on the release
#    that merged it with the fix reversed (a faithful nightly). Pure-Python trees: the tests
#    run vLLM's Python/Triton code with capture-safe stand-ins for its few compiled ops.
vllm-patchset validate --work build/gpu-validate

# 2. The overlay on the image's real vLLM: apply, verify, and the tests with the real ops.
vllm-patchset overlay apply
vllm-patchset overlay verify
VLLM_PATCHSET_GPU_REPORT=build/gpu-installed.json \
  "$PY" -m pytest tests/gpu --confcutdir tests/gpu -p no:cacheprovider -rA
grep -q '"mode": "native"' build/gpu-installed.json || { echo "tests/gpu did not run natively" >&2; exit 1; }
