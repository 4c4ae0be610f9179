r"""MATH jsonl (Hendrycks: {"problem", "solution", "level", "type"}) -> verl-schema parquet.

    python -m tools.prepare_math --input-dir data/math_sample --output-dir runs/data/math

Reads ``train.jsonl`` and/or ``test.jsonl`` (whichever exist) and writes ``<split>.parquet``: data_source
"DigitalLearningGmbH/MATH-lighteval", one user message (problem plus the \boxed{} instruction), ability
"math", reward_model {"style": "rule", "ground_truth": <last \boxed{} of the solution>} and extra_info
{split, index, level, type, answer, question}.
"""
from __future__ import annotations

import sys
from pathlib import Path

from rlhf_mcore.data import make_row, read_jsonl
from rlhf_mcore.rewards.hendrycks_math import extract_boxed_answer
from tools.prepare_splits import split_parser, write_splits

REPO = Path(__file__).resolve().parents[1]
DATA_SOURCE = "DigitalLearningGmbH/MATH-lighteval"
INSTRUCTION = "Let's think step by step and output the final answer within \\boxed{}."
SPLITS = ("train", "test")


def math_rows(path: Path, split: str, limit: int | None = None) -> list[dict]:
    """verl rows of one split; a solution without a complete \\boxed{} raises naming file and line."""
    rows = []
    for line_no, record in read_jsonl(path, ("problem", "solution"))[:limit]:
        truth = extract_boxed_answer(str(record["solution"]))
        if not truth:
            raise ValueError(f"{path}:{line_no}: solution has no complete \\boxed{{...}} answer")
        problem = str(record["problem"])
        extra = {
            "split": split, "index": len(rows), "level": str(record.get("level", "")),
            "type": str(record.get("type", "")), "answer": record["solution"], "question": problem,
        }
        rows.append(make_row(DATA_SOURCE, f"{problem} {INSTRUCTION}", "math", truth, extra))
    return rows


def parse_args(argv: list[str] | None = None):
    return split_parser(__doc__.splitlines()[0], REPO / "data" / "math_sample",
                        "folder with train.jsonl and/or test.jsonl (default: data/math_sample)",
                        REPO / "runs" / "data" / "math").parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    found = [s for s in SPLITS if (args.input_dir / f"{s}.jsonl").is_file()]
    if not found:
        raise SystemExit(f"{args.input_dir}: no train.jsonl or test.jsonl. Pass --input-dir.")
    return write_splits(args, found, lambda split, limit: math_rows(args.input_dir / f"{split}.jsonl", split, limit))


if __name__ == "__main__":
    sys.exit(main())
