#!/usr/bin/env bash
# Issue 9 on nvidia-h200-x2: SGLang rollout at every training layout, in two device calls (wheels: two parts).
#   part1: carries .whl and .carry/part1;  part2: carries .carry/part2, right after part1 on the same machine.
# part2, in priority order (each step bounded; results under $OUT as they come):
#   1. the 0.5B-shape GRPO step on one GPU (64 prompts; also warms the JIT caches for the next starts)
#   2. the same at DP2 with the prompts doubled (128), then TP2 and PP2 (128): scaling and weight refresh
#   3. tiny PPO, greedy rollout, 3 steps, seed 1: one GPU vs TP2 / PP2 / DP2 (metrics within bf16 noise)
set -uo pipefail
PART=${1:?part1|part2}
source tools/gpu/gpu_env.sh
sglang_part "$PART"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
B=(-m tools.bench.bench_grpo_step --engine sglang --steps 2 --warmup 1 --out "$OUT")
TR=(python3 -m torch.distributed.run --standalone --nproc_per_node 2)
echo "=== 1 GPU, 64 prompts ($(date +%T))"; timeout 240 python3 "${B[@]}" --prompts 64 > "$OUT/one.log" 2>&1; tail -3 "$OUT/one.log"
for L in "--tp 1" "--tp 2" "--pp 2"; do
  echo "=== 2 GPUs $L, 128 prompts ($(date +%T))"
  timeout 150 "${TR[@]}" "${B[@]}" --prompts 128 $L > "$OUT/two_${L// /}.log" 2>&1; tail -3 "$OUT/two_${L// /}.log"
done
T=(--config configs/tiny_ppo.yaml rollout.engine=sglang rollout.temperature=0 trainer.seed=1 trainer.total_steps=3
   trainer.save_freq=0 trainer.resume=disable "trainer.logger=[console,jsonl]" rollout.sglang.gpu_memory_utilization=0.2)
echo "=== tiny PPO greedy, 1 GPU ($(date +%T))"
timeout 120 python3 -m rlhf_mcore.train "${T[@]}" trainer.output_dir="$OUT/tiny_1gpu" > "$OUT/tiny_1gpu.log" 2>&1
for L in "parallel.tp=2" "parallel.pp=2" "parallel.tp=1"; do
  echo "=== tiny PPO greedy, 2 GPUs $L ($(date +%T))"
  timeout 120 "${TR[@]}" -m rlhf_mcore.train "${T[@]}" $L trainer.output_dir="$OUT/tiny_$L" > "$OUT/tiny_$L.log" 2>&1
done
grep -h "step 3/3" "$OUT"/tiny_*.log
