"""`rlhf_mcore.train --validate-only` in process: the config's error lines, checked to come without a traceback."""
from __future__ import annotations

from rlhf_mcore.train import main


def validate_only_errors(capsys, config: str, *overrides: str) -> list[str]:
    """The '  - ' lines of the run's start-up report (empty when the config is valid)."""
    code = main(["--config", config, "--validate-only", *overrides])
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return [line[4:] for line in err.splitlines() if line.startswith("  - ")] if code else []
