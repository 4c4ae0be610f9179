#!/usr/bin/env bash
# Issue 8 on one H200, four device calls on the same warm machine (a call carries at most 64 MiB):
#   part1: megatron-core + SGLang part 1; GPU tests (decode attention kernel, fp32 logits, graphed decode,
#          decode layer, fused kernels); the GRPO step with rollout.engine=native (split-KV attention); with
#          ATTN=1 the decode-attention micro-benchmark, AB=1 the sdpa A/B, TRL=1 TRL's GRPOTrainer (W1/trl)
#   part2: SGLang part 2; the GRPO step with rollout.engine=sglang, and with $SGL_EXTRA (a numerics variant)
#   part3: the first half of the SmolLM2-135M-Instruct GGUF (98 MB, split in two: `split -n 2`)
#   part4: the second half; SmolLM2 GRPO on GSM8K for $STEPS steps with each engine: the rollout-vs-trainer
#          log-prob mismatch on the real model (results: mismatch_smollm2_*.jsonl, mismatch_smollm2.json)
# Carry folders: part1 W1 (megatron-core in W1/mcore, TRL wheels in W1/trl, SGLang part 1 in W1), part2 W2,
# part3 / part4 GG1 / GG2 (smollm2.gguf.part1 / .part2), e.g. (2026-12-01, third session):
#   run(carry=[".gpu-speed-w1"]):  W1=.gpu-speed-w1 bash tools/bench/gpu_speed_mismatch.sh part1
#   run(carry=[".gpu-speed-w2"]):  W2=.gpu-speed-w2 bash tools/bench/gpu_speed_mismatch.sh part2
#   run(carry=[".gpu-gguf1"]):     GG1=.gpu-gguf1 bash tools/bench/gpu_speed_mismatch.sh part3
#   run(carry=[".gpu-gguf2"]):     GG2=.gpu-gguf2 bash tools/bench/gpu_speed_mismatch.sh part4
set -uo pipefail
PART=${1:?part1|part2|part3|part4}
STEPS=${STEPS:-4}
SGL_EXTRA=${SGL_EXTRA:-}  # e.g. "--fp32-lm-head 1"
MCORE=${W1:-}/mcore SGL1=${W1:-} SGL2=${W2:-}
source tools/bench/gpu_env.sh
bench() { local name=$1; shift; echo "=== $name ($(date +%T))"
  timeout 330 python3 -m tools.bench.bench_grpo_step "$@" 2>&1 | grep -Ev "rollout: +[0-9]+%" | tee "$OUT/$name.log" | tail -5; }

if [[ $PART == part1 ]]; then
  mkdir -p /tmp/site /tmp/trlsite && install "$MCORE"/megatron_core*.whl "$SGL1"/*.whl || exit 3
  nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
  echo "=== GPU tests ($(date +%T))"
  timeout 240 python3 -m pytest -q -p no:cacheprovider -p no:warnings -m gpu tests/kernels \
      tests/rollout/test_static_decode.py tests/rollout/test_decode_layer.py tests/rollout/test_logprob_agreement.py \
      2>&1 | tail -8
  if [[ -n ${ATTN:-} ]]; then echo "=== decode attention ($(date +%T))"
    timeout 120 python3 -m tools.bench.bench_decode_attention --out "$OUT" 2>&1 | tail -14; fi
  bench native --engine native --steps 2 --out "$OUT"
  if [[ -n ${AB:-} ]]; then
    bench native_sdpa_attention --engine native --decode-attention sdpa --steps 1 --out "$OUT/variants/sdpa"; fi
  if [[ -n ${TRL:-} ]]; then echo "=== TRL ($(date +%T))"
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/trlsite "$W1"/trl/*.whl
    PYTHONPATH=/tmp/trlsite timeout 300 python3 -m tools.bench.bench_trl_grpo --out "$OUT" 2>&1 | tr '\r' '\n' \
        | grep -v "it/s\|s/it\]" | tee "$OUT/trl.log" | tail -4; fi
  exit 0
fi
if [[ $PART == part2 ]]; then
  sglang_part part2
  bench sglang --engine sglang --attention-backend flashinfer --steps ${SGL_STEPS:-2} --out "$OUT"
  if [[ -n $SGL_EXTRA ]]; then
    bench sglang_variant --engine sglang --attention-backend flashinfer --steps 1 $SGL_EXTRA --out "$OUT/variants/sgl"
  fi
  exit 0
fi
if [[ $PART == part3 ]]; then
  cp "$GG1"/smollm2.gguf.part1 /tmp/ && echo "kept half 1" && exit 0
  exit 4
fi
W=/tmp/mismatch TINY=()
if [[ -n ${DRY:-} ]]; then  # CPU dry run of part4 (native only, tiny sizes): DRY=1 OUT=/tmp/dry bash ... part4
  export PATH=$PWD/.venv/bin:$PATH
  GGUF=$(python3 -c "from tools.gguf_to_hf import find_smollm2_gguf as f; print(f())")
  TINY=(model.dtype=fp32 data.train_batch_size=2 rollout.n=2 rollout.max_response_length=8
        actor.ppo_mini_batch_size=2 actor.micro_batch_size_per_gpu=4 reward.num_workers=1)
else
  [[ -f /tmp/smollm2.gguf.part1 && -d /tmp/site/sglang ]] || { echo COLD_MACHINE; exit 9; }
  GGUF=/tmp/smollm2.gguf
  cat /tmp/smollm2.gguf.part1 "$GG2"/smollm2.gguf.part2 > $GGUF || exit 4
fi
mkdir -p "$OUT"
python3 -m tools.gguf_to_hf --gguf $GGUF --out $W/hf --dtype bf16 --overwrite 2>&1 | tail -1
python3 -m tools.convert_checkpoint hf-to-mcore --hf-dir $W/hf --out $W/mcore --dtype bf16 2>&1 | tail -1
python3 -m tools.prepare_gsm8k --output-dir $W/gsm8k --max-test 64 2>&1 | tail -1
train() { local name=$1; shift; echo "=== SmolLM2 GSM8K, $name ($(date +%T))"
  timeout 240 python3 -m rlhf_mcore.train --config configs/gsm8k_grpo_smollm2.yaml model.hf_path=$W/hf \
      model.load=$W/mcore data.train_files=$W/gsm8k/train.parquet data.val_files=$W/gsm8k/test.parquet \
      trainer.output_dir=$W/$name trainer.val_before_train=false trainer.test_freq=-1 trainer.save_freq=0 \
      trainer.resume=disable trainer.logger=[console,jsonl] trainer.total_steps=$STEPS "${TINY[@]}" "$@" 2>&1 \
      | grep -v "Warning\|warnings.warn\|rollout: " | tail -${STEPS} | cut -c1-220
  cp $W/$name/metrics.jsonl "$OUT/mismatch_smollm2_$name.jsonl"; }
train native rollout.engine=native
[[ -n ${DRY:-} ]] || train sglang rollout.engine=sglang rollout.sglang.attention_backend=flashinfer
[[ -n ${DRY:-} ]] || train sglang_fp32_lm_head rollout.engine=sglang rollout.sglang.attention_backend=flashinfer \
    rollout.sglang.fp32_lm_head=true
python3 - "$OUT" <<'EOF'
import json, sys, pathlib
out = pathlib.Path(sys.argv[1]); summary = {}
for f in sorted(out.glob("mismatch_smollm2_*.jsonl")):
    rows = [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
    vals = [r["rollout/mismatch_logp_abs_diff"] for r in rows if "rollout/mismatch_logp_abs_diff" in r]
    gen = [r["timing_s/gen"] for r in rows if "timing_s/gen" in r]
    summary[f.stem.removeprefix("mismatch_smollm2_")] = {"mismatch_logp_abs_diff": vals, "gen_s": gen,
        "kl_k3": [r.get("rollout/mismatch_kl_k3") for r in rows if "rollout/mismatch_kl_k3" in r]}
    print(f"{f.stem:<40} mismatch per step: " + " ".join(f"{v:.4f}" for v in vals))
(out / "mismatch_smollm2.json").write_text(json.dumps(summary, indent=1))
EOF
