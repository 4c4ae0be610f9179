"""What the prepare_* tools share: their command line (--input-dir, --output-dir, --max-train, --max-test) and the
writing of each split's rows to `<output-dir>/<split>.parquet`."""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Callable

from rlhf_mcore.data import write_prompt_parquet


def split_parser(description: str, input_dir: Path | None, input_help: str,
                 output_dir: Path) -> argparse.ArgumentParser:
    """The shared arguments; `input_dir` None makes --input-dir required."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--input-dir", type=Path, default=input_dir, required=input_dir is None, help=input_help)
    parser.add_argument("--output-dir", type=Path, default=output_dir)
    parser.add_argument("--max-train", type=int, default=None, help="keep the first N training rows")
    parser.add_argument("--max-test", type=int, default=None, help="keep the first N test rows")
    return parser


def write_splits(args: argparse.Namespace, splits, rows_of: Callable[[str, int | None], list[dict]]) -> int:
    """rows_of(split, limit) for each split, written and reported; a limit that is not positive is refused first."""
    limits = {"train": args.max_train, "test": args.max_test}
    for split in splits:
        if limits[split] is not None and limits[split] <= 0:
            raise SystemExit(f"--max-{split} must be positive (got {limits[split]})")
    for split in splits:
        out = args.output_dir / f"{split}.parquet"
        print(f"{split}: {write_prompt_parquet(rows_of(split, limits[split]), out)} rows -> {out}")
    return 0
