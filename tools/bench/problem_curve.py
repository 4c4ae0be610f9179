"""Which problems a run gets right over its validations, and how: is accuracy a skill or a shortcut?

    python -m tools.bench.problem_curve RUN_VAL_DIR [RUN_VAL_DIR ...]

RUN_VAL_DIR holds a run's validation dumps, `<step>.jsonl` (`trainer.validation_data_dir`: one greedy sample a
prompt, with `input`, `output`, `ground_truth`, `acc`). For each dump after the first it gives the problems right,
how many of the previous dump's stayed right, were gained and were lost, and over the run how many problems were
ever right and how many were right at every check after the start. A skill keeps its problems; a guess moves between
them.

It also counts the GSM8K shortcut: a final answer (`#### N`) that is a number copied from the question. The truth
is in the question for a few percent of problems, so a policy that copies a number is sometimes right without any
working. `copied_answers` is the share of all final answers copied from the question, `right_truth_in_question` the
share of right answers whose truth appears there, against `truth_in_question`, the base rate over all problems.
"""
from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
FINAL = re.compile(r"####\s*(-?[\d,]*\.?\d+)")


def numbers(text: str) -> set[str]:
    """The numbers written in a text, commas dropped.

    >>> sorted(numbers("She sells 1,200 eggs at $2.50 and 3 more"))
    ['1200', '2.50', '3']
    """
    return {m.replace(",", "") for m in NUMBER.findall(text)}


def final_answer(output: str) -> str | None:
    """The number after the first `####`, commas dropped.

    >>> final_answer("6 * 6 = 36 pages.\\n#### 3"), final_answer("no answer")
    ('3', None)
    """
    found = FINAL.search(output)
    return found.group(1).replace(",", "") if found else None


def question(prompt: str) -> str:
    """The user's turn of a chat-rendered prompt (the whole prompt when no `user` line is found)."""
    body = prompt.split("user\n", 1)[-1]
    return body.split("assistant\n", 1)[0]


def is_right(row: dict) -> bool:
    return float(row.get("acc", 0.0)) >= 1.0


def shortcut(rows: list[dict]) -> dict[str, float]:
    """How often answers are copied from the question, for all answers and for the right ones."""
    in_q = [str(r["ground_truth"]).replace(",", "") in numbers(question(r["input"])) for r in rows]
    finals = [final_answer(r["output"]) for r in rows]
    copied = [f is not None and f in numbers(question(r["input"])) for r, f in zip(rows, finals)]
    right = [i for i, r in enumerate(rows) if is_right(r)]
    return {"truth_in_question": sum(in_q) / max(len(rows), 1),
            "copied_answers": sum(copied) / max(len(rows), 1),
            "right_truth_in_question": sum(in_q[i] for i in right) / len(right) if right else 0.0}


def curve(dumps: dict[int, list[dict]]) -> dict:
    """Per validation step: problems right, kept / gained / lost against the previous check; ever and always right."""
    steps = sorted(dumps)
    right = {s: {r["input"] for r in dumps[s] if is_right(r)} for s in steps}
    checks = [{"step": s, "right": len(right[s]), "prompts": len(dumps[s])} for s in steps]
    for prev, cur, row in zip(steps, steps[1:], checks[1:]):
        row.update(kept=len(right[prev] & right[cur]), gained=len(right[cur] - right[prev]),
                   lost=len(right[prev] - right[cur]))
    later = [right[s] for s in steps[1:]]
    return {"checks": checks, "ever_right_after_start": len(set().union(*later)) if later else 0,
            "right_at_every_check_after_start": len(set.intersection(*later)) if later else 0,
            "shortcut_start": shortcut(dumps[steps[0]]) if steps else {},
            "shortcut_end": shortcut(dumps[steps[-1]]) if steps else {}}


def read_dumps(val_dir: Path) -> dict[int, list[dict]]:
    return {int(p.stem): [json.loads(line) for line in p.read_text().splitlines() if line.strip()]
            for p in val_dir.glob("*.jsonl") if p.stem.isdigit()}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("val_dirs", nargs="+")
    args = ap.parse_args(argv)
    print(json.dumps({d: curve(read_dumps(Path(d))) for d in args.val_dirs}, indent=2))


if __name__ == "__main__":
    main()
