#!/usr/bin/env bash
# The GPU measurements of this project, in two device calls (the device tool carries at most 64 MiB
# per call, and the SmolLM2 GGUF is 98 MB, so it travels in two parts). From the repo root there:
#   part1: needs .whl/ (megatron-core cp312 + gguf wheels) and .carry1/ (first half of the GGUF)
#   part2: needs .carry2/ (second half + GSM8K jsonl); must follow part1 on the same warm machine
#   features: needs .whl/; optimizer/grad-buffer offload during rollout, recompute, distributed optimizer
# Results go to $OUT (JSON tables + logs); what a report keeps goes to benchmarks/<date>-<question>/.
set -uo pipefail
PART=${1:?part1|part2}
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
NGPU=$(nvidia-smi -L | wc -l)
log() { echo "=== $* ($(date +%T))"; }

if [[ $PART == part1 ]]; then
  mkdir -p /tmp/site && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site .whl/*.whl || exit 3
  cp .carry1/smollm2.gguf.part1 /tmp/
  nvidia-smi -L; python3 -c "import torch, megatron.core; print(torch.__version__, megatron.core.__version__)"
  log "tiny GRPO smoke on GPU (1 rank)"
  python3 -m rlhf_mcore.train --config configs/tiny_grpo.yaml trainer.output_dir=/tmp/tiny trainer.save_freq=0 \
      trainer.resume=disable trainer.logger=[console] 2>&1 | grep -v Warn | tail -5
  if [[ $NGPU -ge 2 ]]; then
    log "layout check on 2 GPUs (fp32; TP2 with sequence parallelism)"
    python3 -m torch.distributed.run --nproc_per_node 2 -m tools.check_layouts --config configs/tiny_grpo.yaml \
        --layouts 1x1,2x1,1x2 --sequence-parallel --tolerance 1e-4 2>&1 | grep -A6 "^layout"
  fi
  log "train step: SDPA vs stock local attention, 0.5B shape"
  python3 -m tools.bench.bench_train_step --preset qwen2.5-0.5b --backends sdpa,local --seq-len 2048 \
      --micro-batch 8 --out $OUT 2>&1 | grep -v Warn | tail -6
  log "fused log-prob kernel"
  python3 -m tools.bench.bench_fused_logprob --out $OUT 2>&1 | tail -8
  log "native rollout decode"
  python3 -m torch.distributed.run --nproc_per_node 1 -m tools.bench.bench_rollout --preset qwen2.5-0.5b \
      --dtype bf16 --batch 1,16,64,256 --out $OUT 2>&1 | grep -v Warn | tail -8
  log "GPU tests"
  python3 -m pytest -q -p no:cacheprovider tests -m gpu 2>&1 | tail -4
  exit 0
fi

if [[ $PART == features ]]; then  # memory features on GPU: needs .whl only
  mkdir -p /tmp/site && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site .whl/*.whl || exit 3
  for EXTRA in "trainer.offload_during_rollout=false model.recompute=none" \
               "trainer.offload_during_rollout=true model.recompute=full" \
               "trainer.offload_during_rollout=true model.recompute=selective parallel.use_distributed_optimizer=true"; do
    log "tiny PPO, bf16, hidden 256: $EXTRA"
    python3 -m rlhf_mcore.train --config configs/tiny_ppo.yaml model.hidden_size=256 model.ffn_hidden_size=512 \
        model.dtype=bf16 trainer.total_steps=3 trainer.save_freq=0 trainer.resume=disable trainer.logger=[console] \
        trainer.output_dir=/tmp/feat $EXTRA 2>&1 | tr '\r' '\n' | grep "step \|Error\|error:" | tail -4
  done
  exit 0
fi

[[ -d /tmp/site/megatron ]] || { echo COLD_MACHINE; exit 9; }
cat /tmp/smollm2.gguf.part1 .carry2/smollm2.gguf.part2 > /tmp/smollm2.gguf
log "SmolLM2: GGUF -> HF -> megatron"
python3 -m tools.gguf_to_hf --gguf /tmp/smollm2.gguf --out /tmp/smol-hf --dtype bf16 2>&1 | tail -1
python3 -m tools.convert_checkpoint hf-to-mcore --hf-dir /tmp/smol-hf --out /tmp/smol-mcore --dtype bf16 2>&1 | tail -1
python3 -m tools.prepare_gsm8k --input-dir .carry2 --output-dir /tmp/gsm8k 2>&1 | tail -2
log "GRPO on GSM8K, SmolLM2-135M-Instruct, ${MINUTES:-6} minutes"
python3 -m rlhf_mcore.train --config configs/gsm8k_grpo_smollm2.yaml model.hf_path=/tmp/smol-hf \
    model.load=/tmp/smol-mcore data.train_files=/tmp/gsm8k/train.parquet data.val_files=/tmp/gsm8k/test.parquet \
    trainer.output_dir=$OUT/grpo trainer.val_before_train=true trainer.test_freq=1000 trainer.total_steps=1000 \
    trainer.time_limit_min=${MINUTES:-6} trainer.save_freq=0 trainer.resume=disable trainer.logger=[console,jsonl] \
    "${@:2}" 2>&1 | tr '\r' '\n' | grep -v "Warn\|rollout:\|it/s\]" | tee $OUT/grpo.log | tail -40
