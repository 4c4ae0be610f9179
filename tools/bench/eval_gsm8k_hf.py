"""One greedy GSM8K evaluator for every model of a comparison (issue 41): transformers `generate`, the test
parquet's chat prompts, verl's strict rule.

    python -m tools.bench.eval_gsm8k_hf --data GSM8K/test.parquet --model start=HF --model verl=HF2 \
        --model ours=HF3 --out results/eval.json                      # one H200: ~1 minute a 135M model
    python -m tools.bench.eval_gsm8k_hf --data ... --model tiny=DIR --limit 4 --max-new-tokens 8   # CPU

Each model gets the same prompts: the test set's messages through the model's own chat template with the
generation prompt, greedy, `--max-new-tokens` (256, the preset's response length), stopping at the tokenizer's EOS.
The response is scored by verl's `compute_score` (verl.utils.reward_score.gsm8k: the last `#### N` in the last 300
characters, format score 0) where verl is importable, and by ours (rlhf_mcore.rewards.gsm8k, strict) always; the
JSON gives both accuracies and how many samples they disagree on. Writes OUT (per model: accuracy, its standard
error, the share of answers with a `#### N` line, seconds) and OUT's stem + `_samples.jsonl`.
"""
from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch

from rlhf_mcore.rewards.gsm8k import compute_gsm8k_score, extract_gsm8k_answer


def ours_strict(response: str, truth: str) -> float:
    return compute_gsm8k_score("openai/gsm8k", response, truth)["acc"]


def verl_strict():
    """verl's own strict GSM8K score, or None where verl is not installed. Its module is loaded from its file, so
    that verl's package __init__ (which imports Ray) need not import: the score is plain `re`."""
    import importlib.util

    spec = importlib.util.find_spec("verl")  # finds the package without running its __init__
    path = Path(spec.origin).parent / "utils" / "reward_score" / "gsm8k.py" if spec and spec.origin else None
    if path is None or not path.is_file():
        return None
    module_spec = importlib.util.spec_from_file_location("_verl_gsm8k_score", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return lambda response, truth: float(module.compute_score(response, truth))


def read_rows(path: str, limit: int = 0) -> list[dict]:
    import pyarrow.parquet as pq

    rows = pq.read_table(path).to_pylist()
    return rows[:limit] if limit else rows


def standard_error(p: float, n: int) -> float:
    """Binomial standard error of an accuracy.

    >>> round(standard_error(0.5, 100), 3)
    0.05
    """
    return math.sqrt(p * (1 - p) / n) if n else 0.0


@torch.no_grad()
def generate(model_dir: str, prompts: list[list[dict]], batch: int, max_new_tokens: int) -> tuple[list[str], float]:
    """Greedy responses for chat prompts (longest first, left-padded batches); returns them and the seconds."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cuda = torch.cuda.is_available()
    tok = AutoTokenizer.from_pretrained(model_dir, padding_side="left")
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16 if cuda else torch.float32,
                                                 attn_implementation="sdpa").to("cuda" if cuda else "cpu").eval()
    texts = [tok.apply_chat_template(p, add_generation_prompt=True, tokenize=False) for p in prompts]
    order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
    out: list[str] = [""] * len(texts)
    start = time.perf_counter()
    for k in range(0, len(order), batch):
        idx = order[k:k + batch]
        enc = tok([texts[i] for i in idx], return_tensors="pt", padding=True, add_special_tokens=False)
        enc = enc.to(model.device)
        ids = model.generate(**enc, do_sample=False, max_new_tokens=max_new_tokens, pad_token_id=tok.pad_token_id,
                             eos_token_id=tok.eos_token_id, temperature=None, top_p=None, top_k=None)
        for i, row in zip(idx, ids[:, enc["input_ids"].shape[1]:]):
            out[i] = tok.decode(row, skip_special_tokens=True)
        print(f"  {model_dir}: {min(k + batch, len(order))}/{len(order)} prompts", flush=True)
    return out, time.perf_counter() - start


def score(responses: list[str], truths: list[str]) -> dict:
    """Accuracy by verl's rule (ours where verl is absent), ours beside it, and the samples they disagree on."""
    verl = verl_strict()
    ours = [ours_strict(r, t) for r, t in zip(responses, truths)]
    theirs = [verl(r, t) for r, t in zip(responses, truths)] if verl else ours
    n = len(responses)
    acc = sum(theirs) / n
    return {"acc": acc, "se": standard_error(acc, n), "acc_ours_rule": sum(ours) / n,
            "rule": "verl" if verl else "ours", "disagreements": sum(a != b for a, b in zip(ours, theirs)),
            "format": sum(extract_gsm8k_answer(r) is not None for r in responses) / n, "n": n}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True, help="the test parquet (tools.prepare_gsm8k's test.parquet)")
    p.add_argument("--model", action="append", required=True, metavar="NAME=HF_DIR")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--limit", type=int, default=0, help="the first N rows only (0: all)")
    p.add_argument("--out", required=True, help="the JSON to write")
    args = p.parse_args(argv)
    rows = read_rows(args.data, args.limit)
    prompts = [r["prompt"] for r in rows]
    truths = [str(r["reward_model"]["ground_truth"]) for r in rows]
    results, samples = {}, []
    for spec in args.model:
        name, _, path = spec.partition("=")
        if not path or not Path(path, "config.json").exists():
            results[name] = {"error": f"no HF model at {path!r}"}
            print(f"{name}: no HF model at {path!r}")
            continue
        responses, seconds = generate(path, prompts, args.batch, args.max_new_tokens)
        results[name] = {**score(responses, truths), "seconds": seconds, "path": path}
        print(f"{name}: acc {results[name]['acc']:.2%} (SE {results[name]['se']:.2%}), format "
              f"{results[name]['format']:.1%}, {seconds:.0f} s")
        samples += [{"model": name, "index": i, "response": r, "truth": t} for i, (r, t) in
                    enumerate(zip(responses, truths))]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"data": args.data, "max_new_tokens": args.max_new_tokens, "models": results},
                              indent=2))
    with open(out.with_name(out.stem + "_samples.jsonl"), "w") as f:
        f.writelines(json.dumps(s) + "\n" for s in samples)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
