"""Data that cannot feed the run is refused before any model is built, in --validate-only too: one line, exit 2."""
import subprocess

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rlhf_mcore.train import main
from tests.support.ports import free_port
from tests.support.reliability import ROOT, TINY, env, train_cmd, vowel_row, write_rows

REWARD = f"reward.custom_fn={ROOT / 'data/tiny/reward.py'}:vowel_fraction"


def zero_rows(path):
    pq.write_table(pa.Table.from_pylist([vowel_row()]).slice(0, 0), path)
    return str(path)


def one_problem(err: str) -> str:
    problems = [line for line in err.splitlines() if line.startswith("  - ")]
    assert len(problems) == 1 and "Traceback" not in err, err
    return problems[0]


def bad_utf8(path):
    """8 rows whose 6th data_source holds bytes that are not UTF-8 (pyarrow checks nothing on a view)."""
    table = pa.Table.from_pylist([vowel_row()] * 8)
    sources = [b"tiny/vowels"] * 5 + [b"tiny/\xff\xfevowels"] + [b"tiny/vowels"] * 2
    pq.write_table(table.set_column(0, "data_source", pa.array(sources, pa.binary()).view(pa.string())), path)
    return str(path)


CASES = {  # name: (overrides given tmp_path, the phrase of the one line)
    "zero_rows": (lambda t: [f"data.train_files={zero_rows(t / 'z.parquet')}"], "no rows (got 0)"),
    "every_prompt_too_long": (lambda t: ["data.max_prompt_length=2", "data.val_files="], "only 0 of 256 prompts fit"),
    "fewer_rows_than_batch": (lambda t: [f"data.train_files={write_rows(t / 'few.parquet', [vowel_row()] * 3)}"],
                              "fewer than the 4 a batch"),
    "empty_train_files": (lambda t: ["data.train_files="], "data.train_files: required"),
    "empty_val_file": (lambda t: [f"data.val_files={zero_rows(t / 'z.parquet')}"], "data.val_files:"),
    "invalid_utf8": (lambda t: [f"data.train_files={bad_utf8(t / 'u.parquet')}", "data.val_files="],
                     "u.parquet: row 5: column 'data_source' is not valid UTF-8"),
    "overlong_not_filtered": (lambda t: ["data.filter_overlong_prompts=false", "data.max_prompt_length=12",
                                         "data.val_files="],
                              "set data.filter_overlong_prompts=true"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_data_fault_in_validate_only(name, tmp_path, capsys):
    overrides, phrase = CASES[name]
    assert main(["--config", TINY, "--validate-only", REWARD, *overrides(tmp_path)]) == 2
    assert phrase in one_problem(capsys.readouterr().err)


def test_a_run_stops_before_the_model_on_too_few_rows(tmp_path):
    few = write_rows(tmp_path / "few.parquet", [vowel_row()] * 3)
    done = subprocess.run(train_cmd(f"data.train_files={few}", REWARD, f"trainer.output_dir={tmp_path / 'run'}"),
                          capture_output=True, text=True, cwd=ROOT, env=env(0, 1, free_port()), timeout=120)
    assert done.returncode == 2, done.stderr
    assert "fewer than the 4 a batch" in one_problem(done.stderr)
    assert "building" not in done.stdout.lower()
