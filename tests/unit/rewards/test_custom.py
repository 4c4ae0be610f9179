import pytest

from rlhf_mcore.rewards.custom import load_custom_reward, parse_reward_spec


def _write(tmp_path, text):
    path = tmp_path / "reward_file.py"
    path.write_text(text)
    return path


def test_loads_and_calls(tmp_path):
    path = _write(tmp_path, "def score(data_source, solution_str, ground_truth, extra_info=None):\n"
                            "    return {'score': float(solution_str == ground_truth)}\n")
    fn = load_custom_reward(f"{path}:score")
    assert fn("ds", "4", "4", None) == {"score": 1.0}
    assert fn("ds", "4", "5", None) == {"score": 0.0}


@pytest.mark.parametrize("spec", ["no_colon.py", "file.py:", ":fn", "file.py:not-an-identifier"])
def test_bad_spec(spec):
    with pytest.raises(ValueError, match="expected 'path/to/file.py:function_name'"):
        parse_reward_spec(spec)


def test_missing_file(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        load_custom_reward(f"{tmp_path}/nope.py:score")


def test_missing_function_lists_candidates(tmp_path):
    path = _write(tmp_path, "def my_score(a, b, c, d):\n    return 1.0\n")
    with pytest.raises(ValueError, match=r"has no function 'score'. Callables defined there: \['my_score'\]"):
        load_custom_reward(f"{path}:score")


def test_not_callable(tmp_path):
    path = _write(tmp_path, "score = 3\n")
    with pytest.raises(ValueError, match="is a int, not a function"):
        load_custom_reward(f"{path}:score")


def test_wrong_signature(tmp_path):
    path = _write(tmp_path, "def score(solution_str):\n    return 1.0\n")
    with pytest.raises(ValueError, match=r"must accept \(data_source, solution_str, ground_truth, extra_info\)"):
        load_custom_reward(f"{path}:score")


def test_import_error_names_the_file(tmp_path):
    path = _write(tmp_path, "import not_a_real_module_xyz\n")
    with pytest.raises(ValueError, match=r"importing '.*reward_file.py' failed: ModuleNotFoundError"):
        load_custom_reward(f"{path}:score")
