#!/usr/bin/env bash
# Issue 41: verl 0.9.1 itself (FSDP actor, SGLang 0.5.17 rollout, colocated) and ours on the same H200, back to back:
# the GRPO step at bench_grpo_step.py's shape, and the real SmolLM2-135M-Instruct / GSM8K job for MINUTES of training
# each (verl's from its first step, its start-up reported apart; ours from before its model build), then one greedy
# evaluator (tools/bench/eval_gsm8k_hf.py) on all 1319 test prompts. Calls on one warm machine (a call carries
# at most 64 MiB; the wheel sets: tools/gpu/fetch_gpu_wheels.sh, and verl's as
# tools/gpu/verl_research.md section 2 lists, Ray without its Java jars):
#   bash tools/gpu/gpu_verl.sh A   # carry .gpu-speed-w1 (trl/ moved out): SGLang part 1, megatron-core
#   bash tools/gpu/gpu_verl.sh B   # carry .gpu-speed-w2, .gpu-verl-w/small: SGLang part 2, verl and its small deps;
#                                  # the step job's random Qwen2.5-0.5B and prompts
#   bash tools/gpu/gpu_verl.sh C   # carry .gpu-verl-w/ray: Ray 2.60 (stripped); verl's step job (STEPS, 1 warm-up)
#   bash tools/gpu/gpu_verl.sh D   # carry gguf/smollm2.gguf.part1 and .gpu-trl: ours at the step shape (ENGINES:
#                                  # native; add sglang), then TRL's (tools/bench/bench_trl_grpo.py) where .gpu-trl came
#   bash tools/gpu/gpu_verl.sh P   # carry gguf/smollm2.gguf.part2 (part1 copied to /tmp by D or alone): SmolLM2 +
#                                  # GSM8K (~100 s: GGUF -> HF -> megatron), kept out of E's call
#   bash tools/gpu/gpu_verl.sh E   # verl's real job, detached (setsid) so it outlives the call: start-up ~250 s,
#                                  # a warm-up step ~190 s and MINUTES of training do not fit one 600 s call;
#                                  # without P first, carry part 2 and E prepares SmolLM2 + GSM8K itself (~65 s)
#   bash tools/gpu/gpu_verl.sh W   # waits on for it (rc 10: still running, call W again at once)
#   bash tools/gpu/gpu_verl.sh F   # ours on the real job (the preset unchanged)
#   bash tools/gpu/gpu_verl.sh G   # the start model, verl's export and ours through one evaluator; the comparison
#                                  # (MODELS picks some: MODELS=verl after E and W alone, without F)
# Each call must start within 30 s of the previous one's end: run nothing heavy locally meanwhile (a 43 MB carry
# uploading beside a local test suite missed it once). The step job (~600 s): A, B, STEPS=2 C, D;
# the real job alone (~960 s at MINUTES=4): A, REAL=1 B, STEPS=0 C, part1's copy, E (carry part 2), W, F, G.
# verl trains MINUTES from its first step (its start-up and export apart; VERL_TIMEOUT, 1,500 s, kills it); F then
# trains ours as long as verl trained (bench_verl_grpo.train_minutes), at most MINUTES.
# Results in $OUT: verl_<job>.log/_steps.json/.json, grpo_step_part_*.json, ours_gsm8k.log/_metrics.jsonl,
# eval_gsm8k.json (+ _samples.jsonl). tools/bench/bench_grpo_step.py --combine puts the step parts
# in one table. CPU dry run of what runs without verl: python -m tools.bench.bench_verl_grpo --dry-run
set -uo pipefail
PART=${1:?A|B|C|D|P|E|W|F|G}
PY=${PY:-python3}
STEPS=${STEPS:-4}
MINUTES=${MINUTES:-5}
W=${W:-/tmp/verl_w}
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 TOKENIZERS_PARALLELISM=false
export RAY_USAGE_STATS_ENABLED=0 RAY_memory_monitor_refresh_ms=0
source tools/gpu/gpu_env.sh
source tools/gpu/smol.sh
mkdir -p "$OUT"
log() { echo "=== $* ($(date +%T), ${SECONDS}s)"; }
evaluate() {  # OUT_NAME NAME=DIR...: the greedy evaluator on every test prompt
  local name=$1
  shift
  log "evaluate $*"
  $PY -m tools.bench.eval_gsm8k_hf --data $W/gsm8k/test.parquet "${@/#/--model=}" --out $OUT/$name.json 2>&1 \
    | grep -v "Loading weights\|prompts$" | tail -6
}
wait_verl() {  # until E's detached verl run ends (its files to $OUT and $W) or the call nears CALL_S: rc 10
  while [[ ! -f $W/verl_out/rc ]] && (( SECONDS < ${CALL_S:-600} - 25 )); do sleep 5; done
  tail -8 $W/verl_run.txt | cut -c1-250; cp $W/verl_out/* $OUT/ 2>/dev/null
  [[ -f $W/verl_out/rc ]] || { echo "verl still running: call W next, within 30 s"; exit 10; }
  cp $W/verl_out/verl_gsm8k.json $W/verl_out/verl_gsm8k_steps.json $W/
}
case $PART in
A) mkdir -p /tmp/site && install .gpu-speed-w1/*.whl .gpu-speed-w1/mcore/*.whl || exit 3
   nvidia-smi -L ;;
B) [[ -d /tmp/site/sglang ]] || { echo COLD_MACHINE; exit 9; }
   install .gpu-speed-w2/*.whl .gpu-verl-w/small/*.whl || exit 3
   $PY -c "import sglang, verl, hydra, tensordict, transformers as t; print('sglang', sglang.__version__, 'verl', \
verl.__version__, 'transformers', t.__version__)" 2>&1 | tail -1
   [[ -n ${REAL:-} ]] && exit 0  # REAL=1: the real job alone needs no step model
   $PY -m tools.bench.bench_verl_grpo prepare --dir $W/step 2>&1 | tail -2; ls $W/step/hf ;;
C) [[ -d /tmp/site/verl ]] || { echo COLD_MACHINE; exit 9; }
   [[ -d /tmp/site/ray ]] || install .gpu-verl-w/ray/*.whl || exit 3
   df -h /dev/shm /tmp | tail -2
   [[ $STEPS -gt 0 ]] || exit 0  # STEPS=0: Ray only (a lease for the real job alone)
   log "verl: the step job, $STEPS steps"
   $PY -m tools.bench.bench_verl_grpo run --job step --dir $W/step --steps $STEPS --workdir $W/verl_step \
       --timeout ${VERL_TIMEOUT:-500} --out $OUT 2>&1 | tail -25 ;;
D) [[ ! -f gguf/smollm2.gguf.part1 ]] || cp gguf/smollm2.gguf.part1 /tmp/ || exit 4
   for engine in ${ENGINES:-native}; do
     log "ours ($engine): the step job"
     timeout -k 10 ${OURS_TIMEOUT:-240} $PY -m tools.bench.bench_grpo_step --engine $engine --standalone 0 \
         --out $OUT > $OUT/ours_step_$engine.log 2>&1
     echo "rc $?"; grep -v "Warning\|warn(" $OUT/ours_step_$engine.log | tail -4 | cut -c1-250
   done
   if [[ -d .gpu-trl ]]; then
     install .gpu-trl/trl-*.whl || exit 3
     log "TRL: the step job"
     timeout -k 10 ${TRL_TIMEOUT:-240} $PY -m tools.bench.bench_trl_grpo --out $OUT > $OUT/trl_step.log 2>&1
     echo "rc $?"; grep "^TRL" $OUT/trl_step.log | cut -c1-250
   fi
   $PY -m tools.bench.bench_grpo_step --combine $OUT --out $OUT 2>&1 | tail -6 ;;
P) [[ -d /tmp/site/verl ]] || { echo COLD_MACHINE; exit 9; }  # after B (its wheels hold gguf)
   smol_prepare $W /tmp/smollm2.gguf ;;
E) [[ -d /tmp/site/ray ]] || { echo COLD_MACHINE; exit 9; }
   smol_prepare $W /tmp/smollm2.gguf  # P's work, where P did not run (carry part 2): one call boundary fewer
   log "verl: the real job, $MINUTES minutes of training, detached (setsid): E waits, then W"
   rm -rf $W/verl_out; mkdir -p $W/verl_out
   setsid nohup bash -c "$PY -m tools.bench.bench_verl_grpo run --job gsm8k --model $W/hf --data $W/gsm8k \
       --minutes $MINUTES --end-margin 0 --workdir $W/verl_gsm8k --timeout ${VERL_TIMEOUT:-1500} \
       --out $W/verl_out; echo \$? > $W/verl_out/rc" > $W/verl_run.txt 2>&1 < /dev/null &
   wait_verl ;;
W) [[ -d $W/verl_out ]] || { echo "COLD_MACHINE (or E not run)"; exit 9; }
   wait_verl ;;
F) [[ -d $W/mcore ]] || { echo COLD_MACHINE; exit 9; }
   MINUTES=$($PY -c "import json; from tools.bench.bench_verl_grpo import train_minutes as t; \
print(round(t(json.load(open('$W/verl_gsm8k_steps.json')), $MINUTES), 3))" 2>/dev/null || echo $MINUTES)
   log "ours: the real job, $MINUTES minutes (verl's training time, at most MINUTES)"
   timeout -k 10 ${OURS_TIMEOUT:-420} $PY -m rlhf_mcore.train --config configs/gsm8k_grpo_smollm2.yaml \
       model.hf_path=$W/hf model.load=$W/mcore data.train_files=$W/gsm8k/train.parquet data.val_files= \
       trainer.time_limit_min=$MINUTES trainer.total_steps=100000 trainer.test_freq=0 trainer.save_freq=-1 \
       trainer.export_hf=true trainer.resume=disable trainer.output_dir=$W/ours "trainer.logger=[console,jsonl]" \
       2>&1 | grep -v "Warning\|warn(" > $OUT/ours_gsm8k.log
   grep "step [0-9]*/" $OUT/ours_gsm8k.log | tail -2 | cut -c1-250
   grep -i "Traceback\|Error" $OUT/ours_gsm8k.log | head -3
   cp $W/ours/metrics.jsonl $OUT/ours_gsm8k_metrics.jsonl 2>/dev/null ;;
G) [[ -f $W/ours/summary.json || -f $W/verl_gsm8k.json ]] || { echo COLD_MACHINE; exit 9; }
   declare -A model=([start]=$W/hf)
   model[ours]=$($PY -c "import json; print(json.load(open('$W/ours/summary.json'))['hf_export'] or '')" 2>/dev/null)
   model[verl]=$($PY -c "import json; print(json.load(open('$W/verl_gsm8k.json'))['hf_export'] or '')" 2>/dev/null)
   args=()
   for name in ${MODELS:-start verl ours}; do [[ -n ${model[$name]:-} ]] && args+=("$name=${model[$name]}"); done
   evaluate eval_gsm8k "${args[@]}"
   cp $W/verl_gsm8k.json $W/verl_gsm8k_steps.json $OUT/ 2>/dev/null  # E's and F's, for the comparison
   cp $W/ours/metrics.jsonl $OUT/ours_gsm8k_metrics.jsonl 2>/dev/null
   $PY -m tools.bench.bench_verl_grpo compare --out $OUT | tail -30 ;;
*) echo "part A..G, P or W (got $PART)"; exit 2 ;;
esac
