"""tools/convert_checkpoint.py as a command: a bad input is one line on stderr and exit 2."""
from tests.launch import cli


def test_cli_prints_the_error_and_exits_2(tmp_path):
    proc = cli("tools.convert_checkpoint", "hf-to-mcore", "--hf-dir", tmp_path / "absent", "--out", tmp_path / "o",
               check=False, timeout=120)
    assert proc.returncode == 2 and "error: " in proc.stderr and "absent/config.json: no config.json" in proc.stderr
