"""Hostile or broken config files: each is refused with one line and exit 2, quickly, with no traceback."""
import time

import pytest

from rlhf_mcore.train import main

LAUGHS = "a: &a [" + ",".join(['"lol"'] * 9) + "]\n" + "".join(
    f"{b}: &{b} [" + ",".join([f"*{a}"] * 9) + "]\n" for a, b in zip("abcdefgh", "bcdefghi"))
CASES = {  # name: (file bytes, a phrase the one line must hold)
    "billion_laughs": (LAUGHS.encode(), "expand to more than"),
    "non_utf8": (b"model:\n  num_layers: 4\n\xff\xfe: 1\n", "is not UTF-8"),
    "deep_flow": (("a: " + "[" * 3000 + "]" * 3000 + "\n").encode(), "levels deep"),
    "deep_block": ("".join(f"{'  ' * i}k{i}:\n" for i in range(40)).encode() + b"  " * 40 + b"x: 1\n", "levels deep"),
    "duplicate_section": (b"model:\n  num_layers: 4\nmodel:\n  hidden_size: 64\n", "key 'model' is given twice"),
    "duplicate_key": (b"model:\n  num_layers: 4\n  num_layers: 8\n", "key 'num_layers' is given twice"),
    "syntax": (b"model: [\n", "not valid YAML"),
}


def one_line(err: str) -> str:
    problems = [line for line in err.splitlines() if line.startswith("  - ")]
    assert len(problems) == 1 and "Traceback" not in err, err
    return problems[0]


@pytest.mark.parametrize("name", sorted(CASES))
def test_broken_config_file_is_one_line_exit_2(name, tmp_path, capsys):
    text, phrase = CASES[name]
    path = tmp_path / f"{name}.yaml"
    path.write_bytes(text)
    start = time.perf_counter()
    assert main(["--config", str(path), "--validate-only"]) == 2
    assert time.perf_counter() - start < 10
    line = one_line(capsys.readouterr().err)
    assert phrase in line and str(path) in line, line


def test_config_on_a_directory(tmp_path, capsys):
    assert main(["--config", str(tmp_path), "--validate-only"]) == 2
    assert "is a directory" in one_line(capsys.readouterr().err)


def test_unclosed_list_override(capsys):
    from tests.support.reliability import TINY

    assert main(["--config", TINY, "--validate-only", "trainer.logger=[console"]) == 2
    assert one_line(capsys.readouterr().err).startswith("  - trainer.logger: not a valid list")


def test_anchors_and_merge_keys_still_load(tmp_path):
    from rlhf_mcore.config.yaml_strict import load_strict

    data = load_strict("base: &b {lr: 1, n: 2}\nactor: {<<: *b, lr: 3}\ncritic: *b\n")
    assert data["actor"] == {"lr": 3, "n": 2} and data["critic"] == {"lr": 1, "n": 2}
