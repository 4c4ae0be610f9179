"""Where things are: the repository root, its configs and the tiny preset."""
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "configs"
TINY = str(CONFIGS / "tiny_grpo.yaml")
ROOT_STR = str(ROOT)  # for tests that join paths as strings
