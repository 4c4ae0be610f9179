"""Shared by the fault-injection tests: the tiny config, small data files and process launches."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

from rlhf_mcore.config.load import load_config
from rlhf_mcore.data.io import write_prompt_parquet
from rlhf_mcore.data.schema import make_row
from tests.launch import cli_cmd
from tests.launch import spawn as start  # noqa: F401 (the reliability tests' name for it)
from tests.support.paths import ROOT

TINY = str(ROOT / "configs" / "tiny_grpo.yaml")
TIMING_KEYS = ("timing", "perf/", "mem")


def tiny_cfg(tmp_path: Path, *overrides: str, world_size: int | None = 1):
    """configs/tiny_grpo.yaml with absolute data paths, output under tmp_path, no HF export."""
    base = [f"data.train_files={ROOT / 'data/tiny/train.parquet'}", f"data.val_files={ROOT / 'data/tiny/test.parquet'}",
            f"reward.custom_fn={ROOT / 'data/tiny/reward.py'}:vowel_fraction", f"trainer.output_dir={tmp_path / 'run'}",
            "trainer.export_hf=false"]
    return load_config(TINY, base + list(overrides), world_size=world_size)


def overrides_for(tmp_path: Path, *extra: str) -> list[str]:
    return [f"trainer.output_dir={tmp_path / 'run'}", "trainer.export_hf=false", *extra]


def write_rows(path: Path, rows: list[dict]) -> str:
    write_prompt_parquet(rows, path)
    return str(path)


def vowel_row(question: str = "say aeiou", ground_truth="aeiou", data_source: str = "tiny/vowels") -> dict:
    return make_row(data_source, question, "tiny", ground_truth, {"split": "test"})


def env(rank: int | None = None, world: int = 1, port: int | None = None) -> dict:
    e = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    if rank is not None:
        e.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                 MASTER_PORT=str(port))
    return e


def train_cmd(*overrides: str) -> list[str]:
    return cli_cmd("rlhf_mcore.train", "--config", TINY, *overrides)


def wait_for(predicate, timeout_s: float, every_s: float = 0.2):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every_s)
    return predicate()


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def alive(pid: int) -> bool:
    """True while `pid` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found
