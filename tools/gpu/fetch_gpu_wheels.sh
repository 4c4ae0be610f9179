#!/usr/bin/env bash
# The wheels the GPU scripts carry to the H200 box (Python 3.12, torch 2.11 cu130, no network), fetched here
# from PyPI and laid out as two carry folders of at most MAX_MIB each (a device call carries 64 MiB, the
# repository included):
#   W1/mcore  megatron-core 0.16.1 (cp312)
#   W1/trl    TRL 1.16 and what the box lacks for it (datasets, dill, multiprocess)
#   W1/*.whl  SGLang 0.5.17's wheel set, first part;  W2/*.whl  its second part
# SGLang's two largest wheels are stripped to what Hopper needs with attention_backend=triton|flashinfer:
# sglang-kernel keeps sm90/common_ops and its python (no FA3 flash_ops, FlashMLA, InfLLM or sm100 ops: they
# load lazily), xgrammar drops its static C++ library. transformers 5.12.1 is carried because the box's 5.17
# breaks `import sglang` 0.5.17.
#   usage: bash tools/gpu/fetch_gpu_wheels.sh [W1=.gpu-speed-w1] [W2=.gpu-speed-w2] [MAX_MIB=52]
# (keep the folders out of git: echo /.gpu-*/ >> .git/info/exclude). sglang-kernel is a 365 MiB download.
set -euo pipefail
W1=${1:-.gpu-speed-w1} W2=${2:-.gpu-speed-w2} MAX_MIB=${3:-52}
RAW=$(mktemp -d)
trap 'rm -rf "$RAW"' EXIT
SGLANG=(
  sglang==0.5.17 sglang-kernel==0.4.5 flashinfer-python==0.6.15.post1 xgrammar==0.2.1 apache-tvm-ffi==0.1.11
  torch-memory-saver==0.0.10 transformers==5.12.1 tokenizers==0.22.2
  pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 typing-extensions==4.16.0
  fastapi==0.165.0 starlette==1.10.0 uvicorn==0.54.0 opentelemetry-api==1.45.2
  orjson==3.13.0 msgspec==0.23.0 pyzmq==27.3.0 pybase64==1.5.1 setproctitle==1.3.8
  partial-json-parser==0.2.1.1.post7 dill==0.4.1 gguf==0.19.0 compressed-tensors==0.20.1 loguru==0.7.3
  openai==2.6.1 distro==1.9.0 jiter==0.19.0 sniffio==1.3.1 ipython==9.18.1 traitlets==5.16.1
)
source "$(dirname "$0")/wheels.sh"
mkdir -p "$W1/mcore" "$W1/trl" "$W2"
download "$W1/mcore" megatron-core==0.16.1
download "$W1/trl" trl==1.16.0 datasets==5.2.0 dill==0.4.1 "multiprocess<0.70.20"
download "$RAW" "${SGLANG[@]}"

PYTHONPATH="$(dirname "$0")" python3 - "$RAW" "$W1" "$W2" "$MAX_MIB" <<'PYEOF'
import os, shutil, sys
from strip_wheel import strip
raw, w1, w2, max_mib = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
STRIP = {"sglang_kernel-": ("sgl_kernel/flash_ops", "sgl_kernel/flashmla_ops", "sgl_kernel/infllm_ops",
                            "sgl_kernel/sm100/"),
         "xgrammar-": ("xgrammar/lib/libxgrammar.a",)}

ready = os.path.join(raw, "ready")
os.makedirs(ready)
for name in sorted(f for f in os.listdir(raw) if f.endswith(".whl")):
    src, dst = os.path.join(raw, name), os.path.join(ready, name)
    drop = next((d for prefix, d in STRIP.items() if name.startswith(prefix)), None)
    strip(src, dst, drop) if drop else shutil.copy(src, dst)
# largest first: into W1 while it fits MAX_MIB beside megatron-core and TRL, the rest into W2
room = max_mib * 2**20 - sum(os.path.getsize(os.path.join(d, f)) for d in (f"{w1}/mcore", f"{w1}/trl")
                             for f in os.listdir(d))
for size, name in sorted(((os.path.getsize(os.path.join(ready, f)), f) for f in os.listdir(ready)), reverse=True):
    into = w1 if size <= room else w2
    room -= size if into == w1 else 0
    shutil.move(os.path.join(ready, name), os.path.join(into, name))
for d in (w1, w2):
    total = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(d) for f in fs)
    print(f"{d}: {total / 2**20:.1f} MiB")
    if total > max_mib * 2**20:
        sys.exit(f"{d} is over {max_mib} MiB: a device call carries 64 MiB with the repository")
PYEOF
