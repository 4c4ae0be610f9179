# Sourced by the GPU scripts (run from the repository root on the device): the box's environment, `install`
# (wheels into /tmp/site, or into $TARGET) and `sglang_part part1|part2`, SGLang's two-call install (the wheel set is 88 MiB:
# a call carries at most 64). Wheel folders: MCORE (megatron-core cp312), SGL1 and SGL2 (SGLang's two parts,
# from tools/gpu/fetch_gpu_wheels.sh: its W1/mcore, W1/*.whl and W2).
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
install() { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "${TARGET:-/tmp/site}" "$@"; }
sglang_part() {  # part1: megatron-core + SGLang part 1, then the call ends; part2: part 2 on the same warm machine
  if [[ $1 == part1 ]]; then
    mkdir -p /tmp/site && install "${MCORE:-.whl}"/megatron_core*.whl "${SGL1:-.carry/part1}"/*.whl || exit 3
    exit 0
  fi
  [[ -d /tmp/site/sglang ]] || { echo COLD_MACHINE; exit 9; }
  # part 2 already in (an earlier call on this machine, e.g. gpu_verl.sh B): nothing to carry or install
  [[ -d /tmp/site/flashinfer && -d /tmp/site/xgrammar ]] && return 0
  install "${SGL2:-.carry/part2}"/*.whl || exit 3
}
