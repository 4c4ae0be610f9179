"""Run the test tiers and say what each cost: `python -m tests.tiers [unit] [dist] [e2e] [-- pytest args]`.

Each tier is one pytest run over tests/<tier>/ (all three when none is named). unit, dist and e2e run under
pytest-xdist with 2 workers (`--dist loadfile`: a file's tests, and the launches its module fixtures share,
stay on one worker) and one OpenMP thread per process: on 2 cores that beats a serial run for every tier
(docs/testing.md has the measurements). TEST_WORKERS=0 runs a tier serially. At the end it prints the tier
table and the 15 slowest tests, and exits non-zero if a tier failed.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TIERS = ("unit", "dist", "e2e")
SLOWEST = 15
TIMES_FILE = ROOT / ".pytest_cache" / "tier_times.json"


def pytest_cmd(tier: str, junit: Path, extra: list[str]) -> list[str]:
    workers = os.environ.get("TEST_WORKERS", "2")
    xdist = ["-n", workers, "--dist", "loadfile"] if workers not in ("0", "1") else []
    return [sys.executable, "-m", "pytest", "-q", "-rfE", *xdist, f"--junitxml={junit}", f"tests/{tier}", *extra]


def read_junit(path: Path) -> tuple[dict, list[tuple[float, str]]]:
    """(counts, [(seconds, test id)]) of one tier's junit XML."""
    counts, times = {"passed": 0, "failed": 0, "skipped": 0}, []
    if not path.exists():
        return counts, times
    for case in ET.parse(path).iter("testcase"):
        outcome = "failed" if case.find("failure") is not None or case.find("error") is not None else \
            "skipped" if case.find("skipped") is not None else "passed"
        counts[outcome] += 1
        times.append((float(case.get("time", 0)), f"{case.get('classname')}::{case.get('name')}"))
    return counts, times


def run_tiers(tiers: list[str], extra: list[str]) -> int:
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    rows, times, failed = [], [], False
    with tempfile.TemporaryDirectory() as tmp:
        for tier in tiers:
            junit = Path(tmp) / f"{tier}.xml"
            print(f"== tier {tier}: tests/{tier}/", flush=True)
            start = time.monotonic()
            rc = subprocess.run(pytest_cmd(tier, junit, extra), cwd=ROOT, env=env).returncode
            wall = time.monotonic() - start
            counts, tier_times = read_junit(junit)
            failed |= rc not in (0, 5)  # 5: nothing collected (a filter left no test)
            rows.append((tier, wall, counts, rc))
            times += tier_times
    print("\n== tiers (wall seconds)")
    for tier, wall, c, rc in rows:
        print(f"{tier:<5} {wall:7.1f} s  {c['passed']:5d} passed {c['failed']:3d} failed {c['skipped']:3d} skipped"
              f"  rc {rc}")
    print(f"total {sum(r[1] for r in rows):7.1f} s")
    print(f"\n== the {SLOWEST} slowest tests (setup + call + teardown)")
    for seconds, name in sorted(times, reverse=True)[:SLOWEST]:
        print(f"{seconds:7.1f} s  {name}")
    TIMES_FILE.parent.mkdir(exist_ok=True)  # every test's seconds, for trimming the suite (git-ignored)
    TIMES_FILE.write_text(json.dumps({"tiers": {t: w for t, w, _, _ in rows},
                                      "tests": [[round(s, 2), n] for s, n in sorted(times, reverse=True)]}, indent=0))
    print(f"(every test's time: {TIMES_FILE.relative_to(ROOT)})")
    return 1 if failed else 0


def main(argv: list[str]) -> int:
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    named = argv[:argv.index("--")] if "--" in argv else argv
    unknown = [t for t in named if t not in TIERS]
    if unknown:
        print(f"tests.tiers: unknown tier(s) {unknown}; tiers: {', '.join(TIERS)}", file=sys.stderr)
        return 2
    return run_tiers(named or list(TIERS), extra)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
