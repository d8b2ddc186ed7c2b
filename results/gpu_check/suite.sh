#!/usr/bin/env bash
# The whole test suite on a lent GPU machine again, at a later commit than check.sh's first call: --device auto picks
# CUDA there and tests/test_cuda_graph.py runs instead of skipping. The machine has torch, numpy, tensorboard and
# pytest; gymnasium, ale-py, tyro and pytest-xdist (with their dependencies that it lacks) are downloaded here into the
# git-ignored .whl/ and carried (the working tree and what a call carries must stay under 64 MiB together):
#   pip download -d .whl --only-binary=:all: --python-version 3.12 --platform manylinux_2_28_x86_64 \
#     --implementation cp gymnasium==1.4.0 ale-py==0.12.1 tyro==1.0.16 pytest-xdist
#   (then keep ale_py, gymnasium, tyro, cloudpickle, farama_notifications, docstring_parser, typeguard, pytest_xdist
#   and execnet)
#   COMMIT=$(git rev-parse --short HEAD) bash results/gpu_check/suite.sh    # on the GPU machine; OUT=<dir> for outputs
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site || exit 1
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; python3 --version
  python3 -c "import torch; print(torch.__version__, torch.cuda.is_available())"; echo "commit ${COMMIT:-?}"; } \
  | tee "$OUT/machine_suite.txt"
for m in numpy tensorboard matplotlib moviepy rliable scipy pandas pytest xdist gymnasium ale_py tyro; do
  python3 -c "import $m" 2>/dev/null || echo "missing: $m"
done | tee -a "$OUT/machine_suite.txt"
timeout "${PYTEST_SECONDS:-330}" python3 -m pytest -q -n "${WORKERS:-14}" -p no:cacheprovider -rfEs tests \
  >"$OUT/pytest_suite.txt" 2>&1
echo "pytest rc $?"; tail -n 40 "$OUT/pytest_suite.txt"
