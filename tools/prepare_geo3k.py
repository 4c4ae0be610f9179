"""Geometry3K (the Hub's `hiyouga/geometry3k` parquet: images, problem, answer) -> verl-schema parquet with images.

    python -m tools.prepare_geo3k --input-dir geometry3k [--output-dir runs/data/geo3k] [--tools] [--max-train N]

Download the dataset first (this machine has no hub access), e.g. `huggingface-cli download hiyouga/geometry3k
--repo-type dataset --local-dir geometry3k`; --input-dir is that folder (its `data/train-*.parquet`,
`data/test-*.parquet`) or any folder with `train.parquet` and `test.parquet`.

Rows are verl's `examples/data_preprocess/geo3k.py` rows: data_source "hiyouga/geometry3k", one user message (the
problem, whose `<image>` marks the figure, plus verl's think-then-\\boxed{} instruction), the `images` column as it
is, reward_model {"style": "rule", "ground_truth": answer}, extra_info {split, index, answer, question}. With
--tools, verl's `geo3k_multiturn_w_tool.py` rows: its system message asking for the `calc_geo3k_reward` tool and
extra_info.tools_kwargs.calc_geo3k_reward.create_kwargs.ground_truth (the tool's answer key; rollout.mode=multi_turn,
rollout.multi_turn.tools=[calc_geo3k_reward]). A row without a problem, an answer or an image is one error naming the
file and row.
"""
from __future__ import annotations

import sys
from pathlib import Path

from tools.prepare_splits import split_parser, write_splits

REPO = Path(__file__).resolve().parents[1]
DATA_SOURCE = "hiyouga/geometry3k"
INSTRUCTION = ("You FIRST think about the reasoning process as an internal monologue and then provide the final "
               "answer. The reasoning process MUST BE enclosed within <think> </think> tags. "
               "The final answer MUST BE put in \\boxed{}.")
TOOL_SYSTEM = ("You are a math expert. You are given a question and you need to solve it step by step. Reasoning step "
               "by step before any tool call. You should use the `calc_geo3k_reward` tool after step by step solving "
               "the question, before generate final answer at least once and refine your answer if necessary. ")


def geo3k_row(record: dict, split: str, index: int, tools: bool, where: str) -> dict:
    """One verl row from a Hub record (`where` names it in errors)."""
    problem, answer, images = record.get("problem"), record.get("answer"), record.get("images")
    for name, value in (("problem", problem), ("answer", answer)):
        if not isinstance(value, str) or not value.strip():
            raise ValueError(f"{where}: '{name}' is missing or empty (got {value!r})")
    if not images:
        raise ValueError(f"{where}: 'images' is empty: a Geometry3K problem has its figure")
    messages = [{"role": "user", "content": f"{problem} {INSTRUCTION}"}]
    extra = {"split": split, "index": index, "answer": answer, "question": problem}
    if tools:
        messages.insert(0, {"role": "system", "content": TOOL_SYSTEM})
        extra.update(need_tools_kwargs=True,
                     tools_kwargs={"calc_geo3k_reward": {"create_kwargs": {"ground_truth": answer}}})
    return {"data_source": DATA_SOURCE, "prompt": messages, "images": list(images), "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": answer}, "extra_info": extra}


def split_file(input_dir: Path, split: str) -> Path:
    """The split's parquet: `<split>.parquet`, else the Hub layout's `data/<split>-*.parquet`."""
    found = [input_dir / f"{split}.parquet"] + sorted((input_dir / "data").glob(f"{split}-*.parquet"))
    path = next((p for p in found if p.is_file()), None)
    if path is None:
        raise SystemExit(f"{input_dir}: no {split}.parquet or data/{split}-*.parquet. Pass --input-dir (the "
                         "downloaded hiyouga/geometry3k folder).")
    return path


def geo3k_rows(path: Path, split: str, tools: bool, limit: int | None = None) -> list[dict]:
    import pyarrow.parquet as pq

    records = pq.read_table(path).to_pylist()[:limit]
    return [geo3k_row(r, split, i, tools, f"{path}: row {i}") for i, r in enumerate(records)]


def parse_args(argv: list[str] | None = None):
    parser = split_parser(__doc__.splitlines()[0], None, "the downloaded hiyouga/geometry3k folder",
                          REPO / "runs" / "data" / "geo3k")
    parser.add_argument("--tools", action="store_true", help="verl's multi-turn rows (the calc_geo3k_reward tool)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return write_splits(args, ("train", "test"), lambda split, limit: geo3k_rows(
        split_file(args.input_dir, split), split, args.tools, limit))


if __name__ == "__main__":
    sys.exit(main())
