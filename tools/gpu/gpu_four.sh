#!/usr/bin/env bash
# Issue 15 on nvidia-h200-x4, two device calls on the same warm machine (SGLang's wheels come in two parts):
#   part1: megatron-core + SGLang part 1, then
#     1. tools.check_layouts at 1x1, 2x1, 1x2, 2x2 with sequence parallelism on TP (tiny PPO model, fp32, NCCL)
#     2. PPO with actor, critic, reference and a reward model, Qwen2.5-0.5B dims (byte vocabulary), bf16,
#        3 steps: TP2 x PP2 on 4 GPUs against TP1 x PP1 on one GPU; every trainable parameter must change
#     3. a Qwen2.5-7B shape at TP2 x PP2, sequence parallelism, distributed optimizer: update-phase MFU, memory
#   part2: SGLang part 2, then the 0.5B-shape GRPO step on 1 GPU (64 prompts), at DP4 and at TP2 x PP2 (256)
# Results under $OUT (logs, JSON). Carry as the other GPU scripts (gpu_env.sh: MCORE, SGL1, SGL2), e.g.
#   run(carry=[".gpu-speed-w1"], kind="nvidia-h200-x4"): MCORE=.gpu-speed-w1/mcore SGL1=.gpu-speed-w1 bash tools/gpu/gpu_four.sh part1
#   run(carry=[".gpu-speed-w2"], kind="nvidia-h200-x4"): SGL2=.gpu-speed-w2 bash tools/gpu/gpu_four.sh part2
# CPU dry run of part1 (tiny dims, gloo, no sequence parallelism): DRY=1 OUT=/tmp/dry4 bash tools/gpu/gpu_four.sh part1
set -uo pipefail
PART=${1:?part1|part2}
source tools/gpu/gpu_env.sh
TR=(python3 -m torch.distributed.run --standalone --nproc_per_node 4)
if [[ -n ${DRY:-} ]]; then
  export PATH=$PWD/.venv/bin:$PATH
  SP=() TOL=1e-5 DIMS=(model.num_layers=4) RMDIMS=(--family llama) DTYPE=fp32
  STEP7B=(--preset tiny --seq-len 32 --micro-batch 2 --num-micro 4 --dtype fp32 --steps 1 --warmup 1)
else
  [[ $PART == part2 ]] || { mkdir -p /tmp/site && install "${MCORE:-.whl}"/megatron_core*.whl "${SGL1:-.carry/part1}"/*.whl || exit 3; }
  SP=(--sequence-parallel) TOL=1e-4 DTYPE=bf16
  DIMS=(model.num_layers=24 model.hidden_size=896 model.ffn_hidden_size=4864 model.num_attention_heads=14
        model.num_query_groups=2)
  RMDIMS=(--family qwen2 --hidden 896 --layers 24 --heads 14 --kv-heads 2 --ffn 4864)
  STEP7B=(--preset qwen2.5-7b --sp 1 --seq-len 2048 --micro-batch 2 --num-micro 8 --steps 3 --warmup 1)
fi
mkdir -p "$OUT"
[[ -z ${DRY:-} ]] && nvidia-smi --query-gpu=name,memory.total --format=csv,noheader

if [[ $PART == part1 ]]; then
  echo "=== 1. layouts, sequence parallel on TP ($(date +%T))"
  timeout 240 "${TR[@]}" -m tools.check_layouts --config configs/tiny_ppo.yaml --layouts 1x1,2x1,1x2,2x2 "${SP[@]}" \
      --tolerance $TOL model.dtype=fp32 2>&1 | grep -v "Warning\|warnings.warn" | tee "$OUT/check_layouts.log" | tail -8
  echo "=== 2. PPO, four roles, 0.5B dims, $DTYPE: 1 GPU vs TP2 x PP2 ($(date +%T))"
  python3 -m tools.bench.make_reward_model --out /tmp/four/rm "${RMDIMS[@]}" 2>&1 | tail -1
  PPO=(configs/tiny_ppo.yaml "${DIMS[@]}" model.dtype=$DTYPE reward.model_path=/tmp/four/rm trainer.total_steps=3
       trainer.save_freq=0 trainer.resume=disable rollout.max_response_length=32 data.train_batch_size=8
       actor.ppo_mini_batch_size=8 critic.ppo_mini_batch_size=8 actor.optim.lr=1e-5 critic.optim.lr=1e-5)
  timeout 240 python3 -m torch.distributed.run --standalone --nproc_per_node 1 -m tests.worker train_run \
      "$OUT/ppo_1gpu.json" "${PPO[@]}" trainer.output_dir=/tmp/four/ppo1 > "$OUT/ppo_1gpu.log" 2>&1
  timeout 300 "${TR[@]}" -m tests.worker train_run "$OUT/ppo_tp2pp2.json" "${PPO[@]}" parallel.tp=2 parallel.pp=2 \
      trainer.output_dir=/tmp/four/ppo4 > "$OUT/ppo_tp2pp2.log" 2>&1
  python3 - "$OUT" <<'EOF'
import json, sys
out = sys.argv[1]
one, four = (json.load(open(f"{out}/ppo_{n}.json")) for n in ("1gpu", "tp2pp2"))
keys = ("critic/score/mean", "actor/pg_loss", "actor/entropy", "actor/grad_norm", "critic/vf_loss",
        "critic/grad_norm", "actor/reward_kl", "response_length/mean")
print(f"roles {four['roles']}, trained {four['trained_roles']}, unchanged params 1 GPU {len(one['unchanged'])}, "
      f"TP2xPP2 {len(four['unchanged'])} of {four['num_params']}")
for i, (a, b) in enumerate(zip(one["metrics"], four["metrics"])):
    print(f"step {i + 1}: " + "  ".join(f"{k.split('/', 1)[-1]} {a[k]:.4g}/{b[k]:.4g} ({abs(a[k] - b[k]) / max(abs(a[k]), 1e-9):.1e})"
                                    for k in keys if k in a and k in b))
EOF
  echo "=== 3. update step of a 7B shape, TP2 x PP2, distributed optimizer ($(date +%T))"
  timeout 300 "${TR[@]}" -m tools.bench.bench_train_step "${STEP7B[@]}" --tp 2 --pp 2 --dist-opt 1 --optimizer-step 1 \
      --backends sdpa --out "$OUT" 2>&1 | grep -v "Warning\|warnings.warn" | tail -4
  exit 0
fi
sglang_part part2
B=(-m tools.bench.bench_grpo_step --steps 2 --warmup 1 --out "$OUT")
echo "=== GRPO sglang, 1 GPU, 64 prompts ($(date +%T))"
timeout 300 python3 "${B[@]}" --engine sglang --attention-backend flashinfer --prompts 64 > "$OUT/one.log" 2>&1
tail -3 "$OUT/one.log"
for L in "--tp 1 --pp 1" "--tp 2 --pp 2"; do
  echo "=== GRPO sglang, 4 GPUs $L, 256 prompts ($(date +%T))"
  timeout 240 "${TR[@]}" "${B[@]}" --engine sglang --attention-backend flashinfer --prompts 256 $L \
      > "$OUT/four_${L// /}.log" 2>&1; tail -3 "$OUT/four_${L// /}.log"
done
