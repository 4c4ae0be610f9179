"""The CLI's front door stays light: `--help` imports no torch, and `--validate-only` of a config whose checks need
no model imports no megatron (it loads in seconds; the run itself imports both)."""
import json

from tests.launch import cli

PROBE = """import json, runpy, sys
sys.argv = ["rlhf_mcore.train", *sys.argv[1:]]
try:
    runpy.run_module("rlhf_mcore.train", run_name="__main__")
except SystemExit as e:
    code = e.code
print(json.dumps({"exit": code, "loaded": sorted({m.split(".")[0] for m in sys.modules} & {"torch", "megatron"})}),
      file=sys.stderr)
"""


def heavy_modules(*args) -> tuple[int, list[str]]:
    proc = cli("-c", PROBE, *args, check=False, timeout=120)
    result = json.loads(proc.stderr.strip().splitlines()[-1])
    return result["exit"], result["loaded"]


def test_help_imports_no_torch():
    assert heavy_modules("--help") == (0, [])


def test_validate_only_imports_no_megatron():
    code, loaded = heavy_modules("--config", "configs/tiny_grpo.yaml", "--validate-only")
    assert code == 0 and "megatron" not in loaded
