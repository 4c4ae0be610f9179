"""tools/bench/problem_curve.py: the per-problem curve and the copied-answer count, on hand-built dumps."""
import doctest
import json

from tools.bench import learning_summary, problem_curve


def row(q, truth, out, right):
    return {"input": f"system\nYou are helpful\nuser\n{q} Let's think\nassistant\n", "ground_truth": truth,
            "output": out, "acc": 1.0 if right else 0.0}


Q = ["Tom has 3 apples and buys 4.", "A box holds 12 pens; 2 boxes?", "Sam reads 5 pages a day for 5 days.",
     "Ann has 1,200 coins and spends 200."]
TRUTH = ["7", "24", "25", "1000"]


def test_doctests():
    assert doctest.testmod(problem_curve).failed == 0


def test_curve_counts_kept_gained_lost_and_every_check():
    dumps = {
        0: [row(Q[i], TRUTH[i], "#### 0", False) for i in range(4)],
        10: [row(Q[i], TRUTH[i], "#### x", i in (0, 1)) for i in range(4)],
        20: [row(Q[i], TRUTH[i], "#### x", i in (1, 2)) for i in range(4)],
        30: [row(Q[i], TRUTH[i], "#### x", i in (1, 2, 3)) for i in range(4)],
    }
    c = problem_curve.curve(dumps)
    assert [x["right"] for x in c["checks"]] == [0, 2, 2, 3]
    assert {k: c["checks"][2][k] for k in ("kept", "gained", "lost")} == {"kept": 1, "gained": 1, "lost": 1}
    assert {k: c["checks"][3][k] for k in ("kept", "gained", "lost")} == {"kept": 2, "gained": 1, "lost": 0}
    assert c["ever_right_after_start"] == 4 and c["right_at_every_check_after_start"] == 1


def test_shortcut_counts_answers_copied_from_the_question():
    rows = [row(Q[0], "7", "3 + 4 = 7\n#### 7", True),      # worked, truth not in the question
            row(Q[1], "24", "12 * 2 = 24\n#### 12", False),  # copied 12
            row(Q[2], "25", "5 * 5 = 25\n#### 5", False),    # copied 5
            row(Q[3], "1000", "#### 1,200", False)]          # copied 1,200 (commas dropped)
    s = problem_curve.shortcut(rows)
    assert s["copied_answers"] == 3 / 4 and s["truth_in_question"] == 0.0 and s["right_truth_in_question"] == 0.0
    rows[2] = row("Sam has 5 pages and 25 more.", "25", "#### 25", True)
    s = problem_curve.shortcut(rows)
    assert s["truth_in_question"] == 1 / 4 and s["right_truth_in_question"] == 1 / 2 and s["copied_answers"] == 3 / 4


def test_learning_summary_carries_the_curve(tmp_path):
    val = tmp_path / "grpo_val"
    val.mkdir()
    for step, right in ((0, ()), (5, (0, 1))):
        (val / f"{step}.jsonl").write_text("\n".join(json.dumps(row(Q[i], TRUTH[i], "#### 1", i in right))
                                                    for i in range(4)))
    out = learning_summary.summarize([], val)
    assert out["problem_curve"]["checks"][1] == {"step": 5, "right": 2, "prompts": 4, "kept": 0, "gained": 2,
                                                 "lost": 0}
