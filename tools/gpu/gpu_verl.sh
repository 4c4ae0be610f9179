#!/usr/bin/env bash
# Issue 41: verl 0.9.1 itself (FSDP actor, SGLang 0.5.17 rollout) on one warm H200, then ours on the same job, back to
# back. Six calls on the same machine, each within the box's idle window (a call carries at most 64 MiB; the wheel
# sets: tools/gpu/fetch_gpu_wheels.sh, and verl's as tools/gpu/verl_research.md section 2 lists, Ray without its
# Java jars):
#   bash tools/gpu/gpu_verl.sh A   # carry .gpu-speed-w1: SGLang part 1, megatron-core, datasets/dill/multiprocess
#   bash tools/gpu/gpu_verl.sh B   # carry .gpu-speed-w2 and .gpu-verl-w/small: SGLang part 2, verl and its small deps
#   bash tools/gpu/gpu_verl.sh C   # carry .gpu-verl-w/ray: Ray 2.60 (stripped), then a Ray smoke test
#   bash tools/gpu/gpu_verl.sh D   # carry gguf/smollm2.gguf.part1
#   bash tools/gpu/gpu_verl.sh E   # carry gguf/smollm2.gguf.part2: SmolLM2 + GSM8K; verl for STEPS steps
#   bash tools/gpu/gpu_verl.sh F   # ours on the same job for STEPS steps: ENGINES (native sglang)
# The job: SmolLM2-135M-Instruct on GSM8K, 64 prompts x 8, 256-token prompts and responses, lr 1e-5, 4 mini-batches,
# k3 KL loss 0.001, no format credit (verl's gsm8k reward), tools/gpu/verl_matched_cmd.sh for verl. verl runs padded
# sdpa (no flash-attn wheel: its remove-padding would mix packed sequences under sdpa); ours packs.
# Per system: $OUT/<system>.log and <system>_steps.json (seconds per step and per phase, tokens, memory).
set -uo pipefail
PART=${1:?A|B|C|D|E|F}
PY=${PY:-python3}
STEPS=${STEPS:-12}
W=/tmp/verl_w
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
export RAY_USAGE_STATS_ENABLED=0 RAY_memory_monitor_refresh_ms=0 TOKENIZERS_PARALLELISM=false
source tools/gpu/gpu_env.sh
source tools/gpu/smol.sh
mkdir -p "$OUT"
case $PART in
A) mkdir -p /tmp/site && install .gpu-speed-w1/*.whl .gpu-speed-w1/mcore/*.whl .gpu-speed-w1/trl/*.whl || exit 3 ;;
B) [[ -d /tmp/site/sglang ]] || { echo COLD_MACHINE; exit 9; }
   install .gpu-speed-w2/*.whl .gpu-verl-w/small/*.whl || exit 3
   $PY -c "import sglang, verl, hydra, tensordict; print('sglang', sglang.__version__, 'verl', verl.__version__)" ;;
C) [[ -d /tmp/site/verl ]] || { echo COLD_MACHINE; exit 9; }
   install .gpu-verl-w/ray/*.whl || exit 3
   timeout 120 $PY -c "
import ray
ray.init(include_dashboard=False, num_gpus=1)
@ray.remote(num_gpus=1)
def probe():
    import torch
    return torch.cuda.get_device_name(0)
print('ray', ray.__version__, 'task on', ray.get(probe.remote()), 'node', ray.util.get_node_ip_address())
ray.shutdown()" 2>&1 | tail -3 ;;
D) cp gguf/smollm2.gguf.part1 /tmp/ && ls -la /tmp/smollm2.gguf.part1 ;;
E) [[ -d /tmp/site/ray ]] || { echo COLD_MACHINE; exit 9; }
   smol_prepare $W /tmp/smollm2.gguf
   nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader,nounits -l 1 > $OUT/verl_gpu.csv &
   SMI=$!
   DATA=$W/gsm8k MODEL=$W/hf timeout -k 10 ${VERL_TIMEOUT:-540} bash tools/gpu/verl_matched_cmd.sh \
       trainer.total_training_steps=$STEPS > $OUT/verl.log 2>&1
   echo "verl rc $?"; kill $SMI 2>/dev/null
   $PY - $OUT/verl.log $OUT/verl_steps.json <<'PYEOF'
import json, re, sys
steps = []
for line in open(sys.argv[1], errors="replace"):
    if "step:" not in line or "timing_s/step" not in line:
        continue
    pairs = dict(re.findall(r"([\w/@.\-]+):([-+0-9.eE]+|nan)", line))
    steps.append({k: float(v) for k, v in pairs.items()})
json.dump(steps, open(sys.argv[2], "w"))
print(f"verl: {len(steps)} steps", *(f"{s.get('timing_s/step', 0):.2f}" for s in steps))
PYEOF
   grep -i "error\|Traceback" $OUT/verl.log | head -5 ;;
F) [[ -d $W/hf ]] || { echo COLD_MACHINE; exit 9; }
   for engine in ${ENGINES:-native sglang}; do
     timeout -k 10 ${OURS_TIMEOUT:-270} $PY -m rlhf_mcore.train --config configs/gsm8k_grpo_smollm2.yaml \
         model.hf_path=$W/hf model.load= data.train_files=$W/gsm8k/train.parquet data.val_files= \
         trainer.total_steps=$STEPS trainer.test_freq=0 trainer.save_freq=0 trainer.export_hf=false \
         trainer.resume=disable trainer.output_dir=/tmp/ours_$engine "trainer.logger=[console,jsonl]" \
         reward.format_score=0 reward.post_answer_penalty=0 rollout.engine=$engine > $OUT/ours_$engine.log 2>&1
     echo "ours ($engine) rc $?"
     cp /tmp/ours_$engine/metrics.jsonl $OUT/ours_${engine}_steps.jsonl 2>/dev/null
     grep "step [0-9]*/" $OUT/ours_$engine.log | tail -2 | cut -c1-300
   done ;;
*) echo "part A..F (got $PART)"; exit 2 ;;
esac
