"""tools/plot_metrics.py: curves from metrics.jsonl (training steps and validation points) into one PNG."""
import json

import pytest

from tools import plot_metrics


def write_run(run_dir, num_steps=4):
    rows = [{"step": 0, "val-core/openai/gsm8k/acc/mean@1": 0.01, "val-core/openai/gsm8k/format/mean@1": 0.1,
             "val-core/openai/gsm8k/reward/mean@1": 0.02}]
    for s in range(1, num_steps + 1):
        rows.append({"step": s, "critic/score/mean": 0.1 * s, "critic/acc/mean": 0.01 * s,
                     "critic/format/mean": 0.2 * s, "response_length/mean": 200 - s,
                     "response_length/clip_ratio": 0.5 / s, "actor/entropy": 1.0, "actor/kl": 0.001 * s,
                     "actor/grad_norm": 0.5, "timing_s/gen": 10.0, "timing_s/update_actor": 3.0})
    rows[-1].update({"val-core/openai/gsm8k/acc/mean@1": 0.03,  # one record per step: the last step's holds
                     "val-core/openai/gsm8k/format/mean@1": 0.9, "val-core/openai/gsm8k/reward/mean@1": 0.1})
    (run_dir / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")


def test_series_split_training_and_validation(tmp_path):
    write_run(tmp_path)
    train, val = plot_metrics.load_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in train] == [1, 2, 3, 4] and [r["step"] for r in val] == [0, 4]
    assert plot_metrics.series(train, "critic/format/mean") == ([1, 2, 3, 4], pytest.approx([0.2, 0.4, 0.6, 0.8]))
    assert plot_metrics.val_series(val, "format") == {"openai/gsm8k": ([0, 4], [0.1, 0.9])}


def test_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")  # in the `test` extra; a bare install may lack it
    write_run(tmp_path)
    assert plot_metrics.main([str(tmp_path)]) == 0
    png = (tmp_path / "metrics.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000  # nine panels of curves, not an empty canvas


def test_missing_metrics_file_is_a_clear_error(tmp_path, capsys):
    assert plot_metrics.main([str(tmp_path)]) == 2
    assert "metrics.jsonl not found" in capsys.readouterr().err


def test_every_timed_phase_and_the_critic_panels(tmp_path):
    pytest.importorskip("matplotlib")
    write_run(tmp_path)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    for row in rows[1:]:
        row.update({"timing_s/ref": 0.5, "timing_s/values": 0.25, "critic/vf_loss": 0.3,
                    "critic/vf_explained_var": 0.1})
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    train, _ = plot_metrics.load_metrics(tmp_path / "metrics.jsonl")
    assert plot_metrics.phases_of(train) == ["gen", "update_actor", "ref", "values"]
    assert plot_metrics.main([str(tmp_path)]) == 0
