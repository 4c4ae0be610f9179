#!/usr/bin/env bash
# Sequence packing on one H200 (one device call, ~2-3 min): the GPU kernel tests of the packed path (not with
# SKIP_TESTS=1), then tools/bench/bench_packing.py (padded vs packed: the auto budget and 8192 tokens). Run from a
# copy of the repo next to .whl/ (the gsm8k_real rows: benchmarks/2026-12-01-packing/gsm8k_rollout_lengths.json):
#   cd .gpu-packing && bash tools/gpu/gpu_packing.sh [bench_packing.py arguments]   (carry .gpu-packing, .whl)
set -uo pipefail
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
mkdir -p /tmp/site && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site ../.whl/*.whl || exit 3
python3 -c "import torch, inspect; from torch.nn.attention.varlen import varlen_attn as f; \
print(torch.__version__, torch.cuda.get_device_name(), inspect.signature(f))"
if [[ -z "${SKIP_TESTS:-}" ]]; then
  echo "=== GPU tests of the packed kernels ($(date +%T))"
  python3 -m pytest -q -p no:cacheprovider -p no:warnings tests/unit/models/test_packing.py -k "kernel" 2>&1 | tail -3
fi
echo "=== bench_packing ($(date +%T))"
python3 -m tools.bench.bench_packing --out $OUT "$@" 2>&1 | grep --line-buffered -v "Warning\|warnings.warn" \
    | tee $OUT/bench_packing.log
echo "=== done ($(date +%T))"
