"""tools/prepare_gsm8k.py and tools/prepare_math.py on the shipped subsets and on broken jsonl."""
import json

import pytest

from rlhf_mcore.data import load_prompt_dataset, read_parquet_rows
from rlhf_mcore.rewards import score_batch
from tests.support.paths import ROOT as REPO
from tools import prepare_gsm8k as gsm8k_tool
from tools import prepare_math as math_tool


def test_gsm8k_subset_to_parquet(tmp_path, tokenizer, capsys):
    gsm8k_tool.main(["--input-dir", str(REPO / "data/gsm8k"), "--output-dir", str(tmp_path),
                     "--max-train", "10", "--max-test", "5"])
    assert "train: 10 rows" in capsys.readouterr().out
    train, test = read_parquet_rows(tmp_path / "train.parquet"), read_parquet_rows(tmp_path / "test.parquet")
    assert (len(train), len(test)) == (10, 5)
    first = train[0]
    question = ("Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
                "How many clips did Natalia sell altogether in April and May?")
    assert first["data_source"] == "openai/gsm8k" and first["ability"] == "math"
    assert first["prompt"] == [{"role": "user", "content": question + " Let's think step by step and output "
                                "the final answer after \"####\"."}]
    assert first["reward_model"] == {"style": "rule", "ground_truth": "72"}
    assert first["extra_info"]["split"] == "train" and first["extra_info"]["index"] == 0
    assert first["extra_info"]["question"] == question and first["extra_info"]["answer"].endswith("#### 72")
    assert [r["reward_model"]["ground_truth"] for r in train[:4]] == ["72", "10", "5", "42"]
    assert len(load_prompt_dataset(tmp_path / "train.parquet", tokenizer, 1024)) == 10


def test_shipped_gsm8k_is_complete_and_references_score_full_reward(tmp_path):
    gsm8k_tool.main(["--output-dir", str(tmp_path)])  # the default input: the full GSM8K in data/gsm8k
    train, test = read_parquet_rows(tmp_path / "train.parquet"), read_parquet_rows(tmp_path / "test.parquet")
    assert (len(train), len(test)) == (7473, 1319)
    rows = train + test
    result = score_batch([r["data_source"] for r in rows], [r["extra_info"]["answer"] for r in rows],
                         [r["reward_model"]["ground_truth"] for r in rows], num_workers=0)
    assert result.scores == [1.0] * len(rows)


def test_gsm8k_malformed_lines(tmp_path):
    (tmp_path / "train.jsonl").write_text('{"question": "q", "answer": "#### 1"}\n{"question": "q", "answer"\n')
    with pytest.raises(ValueError, match=r"train.jsonl:2: invalid JSON"):
        gsm8k_tool.main(["--input-dir", str(tmp_path), "--output-dir", str(tmp_path / "out")])
    (tmp_path / "train.jsonl").write_text('{"question": "q", "answer": "#### 1"}\n{"question": "q", "answer": "2"}\n')
    with pytest.raises(ValueError, match=r"train.jsonl:2: answer has no final '#### <number>' line"):
        gsm8k_tool.main(["--input-dir", str(tmp_path), "--output-dir", str(tmp_path / "out")])
    (tmp_path / "train.jsonl").write_text('{"question": "q", "answer": "#### 1"}\n')
    with pytest.raises(SystemExit, match=r"test.jsonl\(.gz\): not found"):
        gsm8k_tool.main(["--input-dir", str(tmp_path), "--output-dir", str(tmp_path / "out")])


def test_math_sample_to_parquet(tmp_path):
    math_tool.main(["--input-dir", str(REPO / "data/math_sample"), "--output-dir", str(tmp_path)])
    train, test = read_parquet_rows(tmp_path / "train.parquet"), read_parquet_rows(tmp_path / "test.parquet")
    assert [r["reward_model"]["ground_truth"] for r in train] == [
        r"\frac{1}{2}", r"120^\circ", r"25\%", "6", "(3,2)"
    ]
    assert [r["reward_model"]["ground_truth"] for r in test] == [r"5\sqrt{2}", r"\left(-3, 3\right)", r"20\text{ cm}"]
    assert train[0]["data_source"] == "DigitalLearningGmbH/MATH-lighteval"
    assert train[0]["prompt"][0]["content"].endswith(
        "as a common fraction. Let's think step by step and output the final answer within \\boxed{}."
    )
    assert train[1]["extra_info"]["level"] == "Level 2" and train[1]["extra_info"]["type"] == "Geometry"
    # The MATH reward accepts equivalent forms of every shipped answer.
    preds = [r"\boxed{0.5}", r"\boxed{120}", r"\boxed{25}", r"\boxed{x=6}", r"\boxed{(3, 2)}",
             r"\boxed{5\sqrt2}", r"\boxed{(-3,3)}", r"\boxed{20}"]
    rows = train + test
    result = score_batch([r["data_source"] for r in rows], preds, [r["reward_model"]["ground_truth"] for r in rows],
                         num_workers=1)
    assert result.scores == [1.0] * 8


def test_math_solution_without_box(tmp_path):
    lines = [{"problem": "p", "solution": r"\boxed{1}"}, {"problem": "p", "solution": r"so it is \boxed{2"}]
    (tmp_path / "test.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    with pytest.raises(ValueError, match=r"test.jsonl:2: solution has no complete \\boxed"):
        math_tool.main(["--input-dir", str(tmp_path), "--output-dir", str(tmp_path / "out")])
    (tmp_path / "test.jsonl").write_text(json.dumps({"problem": "p"}) + "\n")
    with pytest.raises(ValueError, match=r"test.jsonl:1: missing key\(s\) \['solution'\]"):
        math_tool.main(["--input-dir", str(tmp_path), "--output-dir", str(tmp_path / "out")])


def test_tool_and_data_doctests():
    import doctest

    import rlhf_mcore.data as data

    modules = [gsm8k_tool, math_tool, data.schema, data.dataset, data.sampler, data.validation]
    assert sum(doctest.testmod(m).failed for m in modules) == 0
