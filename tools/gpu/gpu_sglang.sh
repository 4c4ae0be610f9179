#!/usr/bin/env bash
# The embedded SGLang engine on the GPU box, in two device calls (the wheel set is 88 MiB: two parts).
#   part1: carries .whl (megatron-core cp312) and .carry/part1 (SGLang's first part: W1/*.whl of tools/gpu/fetch_gpu_wheels.sh)
#   part2: carries .carry/part2; must follow part1 on the same warm machine
#   SGL_ASYNC=1: after the GPU tests, the tiny GRPO with partial rollouts through SGLang (abort and continue)
set -uo pipefail
PART=${1:?part1|part2}
source tools/gpu/gpu_env.sh
sglang_part "$PART"
echo "=== GPU test: engine vs trainer log-probs, weight updates ($(date +%T))"
python3 -m pytest -q -p no:cacheprovider tests/unit/rollout/test_sglang_engine.py -m gpu -x 2>&1 | tail -15
TINY=(model.hidden_size=256 model.ffn_hidden_size=512 model.dtype=bf16 trainer.total_steps=12
      trainer.save_freq=0 trainer.resume=disable "trainer.logger=[console,jsonl]" data.train_batch_size=8
      rollout.n=8 actor.ppo_mini_batch_size=8 actor.micro_batch_size_per_gpu=16 actor.optim.lr=1e-2)
if [[ -n "${SGL_ASYNC:-}" ]]; then  # issue 37: partial rollouts through SGLang's abort and continue
  echo "=== GRPO on the tiny task, rollout.engine=sglang, partial rollouts ($(date +%T))"
  python3 -m rlhf_mcore.train --config configs/tiny_grpo.yaml rollout.engine=sglang trainer.output_dir=$OUT/tiny_async \
      async_training.partial_rollout=true async_training.staleness_threshold=1 rollout.max_response_length=64 \
      "${TINY[@]}" 2>&1 | tr '\r' '\n' | grep "step \|rollout engine\|partial rollouts\|Error\|error" | tail -14
  python3 -c "import json; rows = [json.loads(l) for l in open('$OUT/tiny_async/metrics.jsonl')]; \
print([(m['step'], round(m['critic/score/mean'], 3), m['async/staleness_max'], m['async/samples_carried_total'], \
round(m['timing_s/gen'], 2)) for m in rows])"
  exit 0
fi
for ENGINE in native sglang; do
  echo "=== GRPO on the tiny task, rollout.engine=$ENGINE ($(date +%T))"
  python3 -m rlhf_mcore.train --config configs/tiny_grpo.yaml rollout.engine=$ENGINE \
      trainer.output_dir=$OUT/tiny_$ENGINE "${TINY[@]}" 2>&1 | tr '\r' '\n' | grep "step \|rollout engine\|Error\|error" | tail -14
done
