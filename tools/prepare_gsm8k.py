"""GSM8K jsonl ({"question", "answer"}, answer ending in "#### N") -> verl-schema parquet.

    python -m tools.prepare_gsm8k [--input-dir data/gsm8k] [--output-dir runs/data/gsm8k] [--max-train 64]

The input folder holds ``train.jsonl`` and ``test.jsonl`` (or ``.jsonl.gz``); the default is the full GSM8K
shipped in ``data/gsm8k`` (MIT).

Writes ``train.parquet`` and ``test.parquet``: data_source "openai/gsm8k", one user message (question plus
the step-by-step instruction), ability "math", reward_model {"style": "rule", "ground_truth": N} and
extra_info {split, index, answer, question}. Rows are taken in file order; --max-* keep the first N.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

from rlhf_mcore.data import make_row, read_jsonl
from tools.prepare_splits import split_parser, write_splits

REPO = Path(__file__).resolve().parents[1]
DATA_SOURCE = "openai/gsm8k"
INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
_ANSWER_RE = re.compile(r"#### (-?[0-9.,]+)")


def gsm8k_ground_truth(answer: str) -> str | None:
    """The number after ``#### `` in a reference answer, commas removed (verl's ``extract_solution``).

    >>> gsm8k_ground_truth("48/2 = 24 clips.\\n#### 1,072")
    '1072'
    """
    found = _ANSWER_RE.search(answer)
    return found.group(1).replace(",", "") if found else None


def gsm8k_rows(path: Path, split: str, limit: int | None = None) -> list[dict]:
    """verl rows of one split; a line without ``#### N`` raises ValueError naming file and line."""
    rows = []
    for line_no, record in read_jsonl(path, ("question", "answer"))[:limit]:
        truth = gsm8k_ground_truth(str(record["answer"]))
        if truth is None:
            raise ValueError(f"{path}:{line_no}: answer has no final '#### <number>' line")
        question = str(record["question"])
        extra = {"split": split, "index": len(rows), "answer": record["answer"], "question": question}
        rows.append(make_row(DATA_SOURCE, f"{question} {INSTRUCTION}", "math", truth, extra))
    return rows


def parse_args(argv: list[str] | None = None):
    return split_parser(__doc__.splitlines()[0], REPO / "data" / "gsm8k", "folder with train.jsonl(.gz) and "
                        "test.jsonl(.gz) (default: data/gsm8k, the full set)",
                        REPO / "runs" / "data" / "gsm8k").parse_args(argv)


def source(input_dir: Path, split: str) -> Path:
    found = next((p for p in (input_dir / f"{split}.jsonl", input_dir / f"{split}.jsonl.gz") if p.is_file()), None)
    if found is None:
        raise SystemExit(f"{input_dir / split}.jsonl(.gz): not found. Pass --input-dir (the repo ships the full "
                         "GSM8K in data/gsm8k).")
    return found


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return write_splits(args, ("train", "test"),
                        lambda split, limit: gsm8k_rows(source(args.input_dir, split), split, limit))


if __name__ == "__main__":
    sys.exit(main())
