import pytest

from rlhf_mcore.data.schema import check_row, make_row


def make_record(question="1+1?", truth="2", source="openai/gsm8k", **extra):
    return make_row(source, question, "math", truth, {"index": 0, **extra})



def test_valid_row_is_normalised():
    record = make_record("What is 2+2?", "4")
    record["ability"] = None
    record["extra_info"] = None
    row = check_row(record, "f.parquet: row 5", index=5)
    assert row.index == 5 and row.data_source == "openai/gsm8k" and row.ground_truth == "4"
    assert row.messages == ({"role": "user", "content": "What is 2+2?"},)
    assert (row.ability, row.extra_info, row.prompt_ids) == ("", {}, ())


def _broken(**changes):
    record = make_record()
    for key, value in changes.items():
        if value is KeyError:
            del record[key]
        else:
            record[key] = value
    return record


@pytest.mark.parametrize(
    "record, message",
    [
        ("not a dict", "must be a dict (got str)"),
        (_broken(data_source=KeyError), "data_source: must be a non-empty string (got None)"),
        (_broken(data_source=""), "data_source: must be a non-empty string"),
        (_broken(prompt="hi"), "prompt: must be a non-empty list of chat messages (got 'hi')"),
        (_broken(prompt=[]), "prompt: must be a non-empty list"),
        (_broken(prompt=["hi"]), "prompt[0]: must be a dict with role and content (got str)"),
        (_broken(prompt=[{"role": "user", "content": "a"}, {"role": "bot", "content": "b"}]),
         "prompt[1].role: must be one of system, user, assistant, tool (got 'bot')"),
        (_broken(prompt=[{"role": "user", "content": 3}]), "prompt[0].content: must be a string (got int)"),
        (_broken(reward_model=KeyError), "reward_model: must be a dict with a ground_truth (got None)"),
        (_broken(reward_model={"style": "rule", "ground_truth": None}), "reward_model: must be a dict"),
        (_broken(ability=3), "ability: must be a string (got int)"),
        (_broken(extra_info=[1]), "extra_info: must be a dict (got list)"),
    ],
)
def test_malformed_rows_name_row_and_field(record, message):
    with pytest.raises(ValueError) as err:
        check_row(record, "train.parquet: row 7")
    assert str(err.value).startswith("train.parquet: row 7: ")
    assert message in str(err.value)
