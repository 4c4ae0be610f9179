"""Write the tiny synthetic task used by tests and tiny configs, in verl's parquet schema.

Prompts are short random letter strings; the reward (data/tiny/reward.py) is the fraction of vowels in
the response, so a learning policy visibly raises it within a few steps of GRPO on a random tiny model.

    python -m tools.make_tiny_dataset --out data/tiny
"""
from __future__ import annotations

import argparse
import os
import random

import pyarrow as pa
import pyarrow.parquet as pq


def rows(num: int, seed: int, split: str) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for i in range(num):
        word = "".join(rng.choice("bcdfghklmnprst") for _ in range(rng.randint(3, 8)))
        out.append({"data_source": "tiny/vowels", "prompt": [{"role": "user", "content": word}],
                    "ability": "synthetic", "reward_model": {"style": "rule", "ground_truth": "aeiou"},
                    "extra_info": {"split": split, "index": i}})
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="data/tiny")
    parser.add_argument("--num-train", type=int, default=256)
    parser.add_argument("--num-test", type=int, default=16)
    args = parser.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    for split, num, seed in (("train", args.num_train, 0), ("test", args.num_test, 1)):
        pq.write_table(pa.Table.from_pylist(rows(num, seed, split)), os.path.join(args.out, f"{split}.parquet"))
    print(f"wrote {args.num_train} train and {args.num_test} test rows to {args.out}")


if __name__ == "__main__":
    main()
