import logging

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rlhf_mcore.data import load_prompt_dataset, make_row, read_jsonl, read_parquet_rows, write_prompt_parquet


def make_record(question="1+1?", truth="2", source="openai/gsm8k", **extra):
    return make_row(source, question, "math", truth, {"index": 0, **extra})



def test_load_tokenises_and_filters(tmp_path, tokenizer, caplog):
    path = tmp_path / "train.parquet"
    questions = ["1+1?", "a question that is far too long for the limit", "2+3?"]
    write_prompt_parquet([make_record(q, str(i), i=i) for i, q in enumerate(questions)], path)
    with caplog.at_level(logging.INFO, logger="rlhf_mcore.data.dataset"):
        ds = load_prompt_dataset(path, tokenizer, max_prompt_length=10)
    assert (len(ds), ds.num_filtered) == (2, 1)
    assert [r.index for r in ds.rows] == [0, 2]  # file row index survives filtering
    assert ds[0].prompt_ids == tuple(ord(c) for c in "u:1+1?\n>")
    assert [r.ground_truth for r in ds.rows] == ["0", "2"]
    assert ds[1].extra_info == {"index": 0, "i": 2}
    assert "dropped 1 of 3 prompts longer than 10 tokens" in caplog.text


def test_several_files_are_concatenated(tmp_path, tokenizer):
    for name in ("a", "b"):
        write_prompt_parquet([make_record(f"{name}?", name)], tmp_path / f"{name}.parquet")
    ds = load_prompt_dataset([tmp_path / "a.parquet", tmp_path / "b.parquet"], tokenizer, 64)
    assert [r.ground_truth for r in ds.rows] == ["a", "b"]


def test_malformed_parquet_row_names_file_and_row(tmp_path, tokenizer):
    rows = [make_record(), make_record(), make_record()]
    rows[2]["prompt"] = [{"role": "narrator", "content": "x"}]
    path = tmp_path / "bad.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)  # bypass the validating writer
    with pytest.raises(ValueError, match=r"bad.parquet: row 2: prompt\[0\].role: must be one of"):
        load_prompt_dataset(path, tokenizer, 64)


def test_missing_columns_and_files(tmp_path, tokenizer):
    path = tmp_path / "cols.parquet"
    pq.write_table(pa.Table.from_pylist([{"data_source": "x", "question": "q"}]), path)
    with pytest.raises(ValueError, match=r"missing column\(s\) \['prompt', 'reward_model'\]"):
        read_parquet_rows(path)
    with pytest.raises(ValueError, match="file not found. Run tools/prepare_gsm8k.py"):
        load_prompt_dataset(tmp_path / "nope.parquet", tokenizer, 64)


def test_overlong_without_filtering_raises(tmp_path, tokenizer):
    path = tmp_path / "t.parquet"
    write_prompt_parquet([make_record("short"), make_record("x" * 50)], path)
    # "u:" + 50 x + "\n" + ">" = 54 tokens
    with pytest.raises(ValueError, match=r"row 1: prompt has 54 tokens > max_prompt_length=20"):
        load_prompt_dataset(path, tokenizer, 20, filter_overlong=False)
    with pytest.raises(ValueError, match="no prompts left"):
        load_prompt_dataset(path, tokenizer, 3)


def test_writer_validates(tmp_path):
    with pytest.raises(ValueError, match="out.parquet: row 1: data_source"):
        write_prompt_parquet([make_record(), make_record(source="")], tmp_path / "out.parquet")


def test_read_jsonl_errors_name_file_and_line(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_text('{"question": "a", "answer": "1"}\n\n{"question": "b", "answer": "2"}\n')
    assert read_jsonl(path, ("question",)) == [(1, {"question": "a", "answer": "1"}),
                                               (3, {"question": "b", "answer": "2"})]
    cases = {
        '{"question": "a"}\n{"question": \n': r"x.jsonl:2: invalid JSON",
        '{"question": "a"}\n[1, 2]\n': r"x.jsonl:2: expected a JSON object \(got list\)",
        '\n{"answer": "1"}\n': r"x.jsonl:2: missing key\(s\) \['question'\]",
    }
    for text, message in cases.items():
        path.write_text(text)
        with pytest.raises(ValueError, match=message):
            read_jsonl(path, ("question",))
