"""Write the demo's short-answer arithmetic task in verl's parquet schema: "What is a + b? Reply with only the
number." with a, b in [1, 30], a held-out test split of other pairs, and the reward in examples/short_answer.py.

    python -m tools.make_arith_dataset --out runs/data/arith

SmolLM2-135M-Instruct answers such prompts with "13 + 14 = 27" about a third of the time right, and rambles on
after the answer in about a third of its greedy answers: a concise, correct answer is within its reach, so a few
GRPO steps on a CPU move it (`make demo`).
"""
from __future__ import annotations

import argparse
import os
import random

import pyarrow as pa
import pyarrow.parquet as pq

PROMPT = "What is {a} + {b}? Reply with only the number."


def pairs(seed: int = 0, low: int = 1, high: int = 30) -> list[tuple[int, int]]:
    """Every (a, b) in [low, high]^2 in a seeded order."""
    out = [(a, b) for a in range(low, high + 1) for b in range(low, high + 1)]
    random.Random(seed).shuffle(out)
    return out


def row(a: int, b: int, split: str, index: int) -> dict:
    return {"data_source": "arith/add", "prompt": [{"role": "user", "content": PROMPT.format(a=a, b=b)}],
            "ability": "math", "reward_model": {"style": "rule", "ground_truth": str(a + b)},
            "extra_info": {"split": split, "index": index}}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="runs/data/arith")
    parser.add_argument("--num-test", type=int, default=32)
    parser.add_argument("--num-train", type=int, default=512)
    args = parser.parse_args(argv)
    every = pairs()
    test, train = every[:args.num_test], every[args.num_test:args.num_test + args.num_train]
    os.makedirs(args.out, exist_ok=True)
    for split, items in (("train", train), ("test", test)):
        table = pa.Table.from_pylist([row(a, b, split, i) for i, (a, b) in enumerate(items)])
        pq.write_table(table, os.path.join(args.out, f"{split}.parquet"))
    print(f"wrote {len(train)} train and {len(test)} held-out test rows to {args.out}")


if __name__ == "__main__":
    main()
