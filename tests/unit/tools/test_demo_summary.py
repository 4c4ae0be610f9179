"""tools/demo_summary.py (the before/after table that ends `make demo`) and the demo's partial-credit reward."""
import importlib.util
import json
import os

import pytest

from tests.support.paths import ROOT_STR as ROOT
from tools import demo_summary


def load(relpath, name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, relpath))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


partial_credit = load("examples/gsm8k_partial_credit.py", "gsm8k_partial_credit")


def test_table_and_locations(tmp_path, capsys):
    rows = [{"step": 0, "val-core/openai/gsm8k/reward/mean@1": 0.05, "val-core/openai/gsm8k/format/mean@1": 0.0,
             "val-core/openai/gsm8k/acc/mean@1": 0.0},
            {"step": 1, "critic/score/mean": 0.1, "critic/format/mean": 0.0, "critic/acc/mean": 0.0,
             "critic/score/std": 0.05, "actor/grad_norm": 1.5},
            {"step": 2, "critic/score/mean": 0.2, "critic/format/mean": 0.25, "critic/acc/mean": 0.0625,
             "critic/score/std": 0.0, "actor/grad_norm": 0.0},
            {"step": 2, "val-core/openai/gsm8k/reward/mean@1": 0.15, "val-core/openai/gsm8k/format/mean@1": 0.125,
             "val-core/openai/gsm8k/acc/mean@1": 0.125}]
    (tmp_path / "metrics.jsonl").write_text("\n".join(map(json.dumps, rows)))
    (tmp_path / "summary.json").write_text(json.dumps({"run_dir": str(tmp_path), "checkpoint": "ck",
                                                       "hf_export": "hf", "metrics": "m"}))
    assert demo_summary.before_after(rows) == [("reward", 0.05, 0.15, 0.1, 0.2), ("format rate", 0.0, 0.125, 0.0, 0.25),
                                               ("accuracy", 0.0, 0.125, 0.0, 0.0625)]
    assert demo_summary.main([str(tmp_path), "--plot", "p.png"]) == 0
    out = capsys.readouterr().out
    assert "training (2 steps, sampled)" in out and "format rate       0.000       0.125" in out
    assert "steps with a learning signal (rewards differ, gradient non-zero): 1 of 2" in out
    assert "  plot        p.png" in out and "  checkpoint  ck" in out


def test_partial_credit_by_hand():
    ref = "She has 3*4 = <<3*4=12>>12 eggs and sells 12-2 = <<12-2=10>>10 of them for $<<10*2=20>>20.\n#### 20"
    score = partial_credit.compute_score
    assert partial_credit.intermediate_results(ref) == ["12", "10", "20"]
    assert score("openai/gsm8k", "12 eggs, 10 sold", "20", {"answer": ref})["score"] == pytest.approx(0.2)
    assert score("openai/gsm8k", "1.0 and 12.0", "20", {"answer": ref})["score"] == pytest.approx(0.1)
    wrong = score("openai/gsm8k", "so\n#### 19", "20", {"answer": ref})
    assert wrong == {"score": 0.1, "acc": 0.0, "pred": "19", "partial": 0.0}  # format_score only
    right = score("openai/gsm8k", "12, 10\n#### 20", "20", {"answer": ref})
    assert right["score"] == pytest.approx(1.3) and right["acc"] == 1.0
    assert score("openai/gsm8k", "#### 20", "20", None)["score"] == 1.0  # no reference: no partial credit


short_answer = load("examples/short_answer.py", "short_answer")


@pytest.mark.parametrize("response,acc,fmt", [
    ("27", 1.0, 1.0), ("13 + 14 = 27", 1.0, 1.0), ("The sum is 27.", 1.0, 1.0),
    ("13 + 14 = 27\n\nThis is a classic example", 1.0, 0.0), ("13 + 14 = 26", 0.0, 1.0), ("", 0.0, 0.0),
    ("I think that the answer to this sum is 27", 1.0, 0.0), ("27 is not 28", 0.0, 1.0)])
def test_short_answer_reward(response, acc, fmt):
    got = short_answer.compute_score("arith/add", response, "27")
    assert (got["acc"], got["format"], got["score"]) == (acc, fmt, acc + short_answer.FORMAT_SCORE * fmt)


def test_arith_task_holds_out_its_test_pairs_and_loads(tmp_path):
    """The demo's task: train and test share no pair, every row is in verl's schema (our loader reads it) and its
    ground truth is the sum, which the reward scores 1.5 when said alone."""
    from rlhf_mcore.data.dataset import check_row
    from rlhf_mcore.data.io import read_parquet_rows
    from tools import make_arith_dataset

    make_arith_dataset.main(["--out", str(tmp_path)])
    split = {name: read_parquet_rows(tmp_path / f"{name}.parquet") for name in ("train", "test")}
    for name, rows in split.items():
        for i, row in enumerate(rows):
            check_row(row, f"{name}: row {i}", i)
    assert len(split["train"]) == 512 and len(split["test"]) == 32
    questions = {name: {r["prompt"][0]["content"] for r in rows} for name, rows in split.items()}
    assert not questions["train"] & questions["test"]
    for row in split["test"]:
        a, b = map(int, row["prompt"][0]["content"].split("?")[0].removeprefix("What is ").split(" + "))
        assert row["reward_model"]["ground_truth"] == str(a + b)
        assert short_answer.compute_score(row["data_source"], str(a + b), str(a + b))["score"] == 1.5
