"""The test suite keeps its shape (docs/testing.md): tiers, one launcher, one worker entry, shared tiny models.

A new multi-rank check is a case of tests/worker.py started through tests/launch.py, not a hand-written
torchrun line or a *_worker.py; a tiny HF model is built in tests/support/, not again in a test file; unit tests
start no Python processes."""
import ast
import re
from pathlib import Path

from tests.support.paths import ROOT
from tests.worker import CASES

TESTS = ROOT / "tests"
THIS = Path(__file__).resolve()
LAUNCHER = TESTS / "launch.py"
# scripts that are run by hand, not by the suite
SCRIPTS = {TESTS / "worker.py", TESTS / "tiers.py", TESTS / "unit" / "algorithms" / "verl_golden" / "gen_golden.py"}
HF_CONFIGS = re.compile(r"\b(Llama|Qwen2|Qwen3|Mistral|Qwen3Moe|Mixtral|Qwen2_5_VL)Config\(")


def python_files(under=TESTS):
    """Every Python file under `under` but this one (it names what it looks for)."""
    return sorted(p for p in under.rglob("*.py") if "__pycache__" not in p.parts and p.resolve() != THIS)


def test_every_test_file_is_in_a_tier():
    misplaced = [p.relative_to(TESTS) for p in python_files() if p.name.startswith("test_")
                 and p.relative_to(TESTS).parts[0] not in ("unit", "dist", "e2e")]
    assert misplaced == [], "test files live under tests/unit, tests/dist or tests/e2e"


def test_torchrun_command_lines_are_written_once():
    """Only tests/launch.py spells out torchrun; nothing else has a __main__ entry point."""
    literal = re.compile(r"""["']torch\.distributed\.run["']""")
    spelled = [p.relative_to(TESTS) for p in python_files() if p != LAUNCHER and literal.search(p.read_text())]
    assert spelled == [], "start processes with tests.launch.torchrun / torchrun_cmd"
    mains = [p.relative_to(TESTS) for p in python_files() if p not in SCRIPTS
             and '__name__ == "__main__"' in p.read_text()]
    workers = [p.relative_to(TESTS) for p in python_files() if p.name.endswith("_worker.py")]
    assert mains == [] and workers == [], "launched code is a case of tests/worker.py (tests/cases/)"


def test_every_case_module_is_a_row_of_the_worker_table():
    modules = {f"tests.cases.{p.stem}" for p in python_files(TESTS / "cases") if p.stem != "__init__"}
    assert set(CASES.values()) == modules
    for module in modules:
        tree = ast.parse((ROOT / (module.replace(".", "/") + ".py")).read_text())
        assert "entry" in {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}, module


def test_unit_tests_start_no_python_processes():
    launching = [p.relative_to(TESTS) for p in python_files(TESTS / "unit") if p not in SCRIPTS
                 and ("sys.executable" in p.read_text() or "tests.launch" in p.read_text())]
    assert launching == [], "a test that starts a process belongs in tests/dist or tests/e2e"


def test_tiny_hf_models_are_built_in_support():
    building = [p.relative_to(TESTS) for p in python_files() if TESTS / "support" not in p.parents
                and HF_CONFIGS.search(p.read_text())]
    assert building == [], "build tiny HF models with tests/support (tiny_hf, tiny_moe)"
