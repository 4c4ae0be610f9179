"""The memory plan against a run: each phase's predicted peak (`rlhf_mcore.plan.phases`) next to the run's measured
one (`perf/max_memory_gb/<phase>`, CUDA), the largest over its steps.

    python -m tools.bench.memory_plan_check --metrics RUN/metrics.jsonl --config CFG [a.b=value ...] \
        [--name NAME] [--out OUT.json]
    python -m tools.bench.memory_plan_check --repredict BENCH.json [BENCH.json ...] [--out OUT.json]

The run's own config and overrides, at its layout (one rank). Plan phases map onto the trainer's timed ones
(`MEASURED`); a plan phase no trainer phase times (optimizer: inside update_actor) has no measurement.
`--repredict` takes `tools/bench/bench_grpo_step.py`'s result files (a directory of them, or the JSON list that
tools/gpu/gpu_memory_plan.sh writes): each holds the run's
resolved config, its model's config.json and the measured peaks (`plan_input`), so the plan of the code checked
out now is compared with the same measurements, on a CPU. Prints one row per phase (predicted, measured,
predicted / measured, the terms); --out writes the rows as one JSON list.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

GIB = 2**30
MEASURED = {"rollout": ("gen",), "log_prob": ("old_log_prob", "ref"), "values": ("values",),
            "update": ("update_actor",), "critic_update": ("update_critic",)}


def trainer_peaks(rows: list[dict], prefix: str = "perf/max_memory_gb/") -> dict[str, float]:
    """GiB per trainer phase: the largest `<prefix><phase>` over the steps (`perf/device_used_gb/`: the device's
    memory in use by every process, an SGLang engine's included).

    >>> trainer_peaks([{"perf/max_memory_gb/gen": 3.0, "loss": 1.0}, {"perf/max_memory_gb/gen": 4.0}])
    {'gen': 4.0}
    """
    out = {}
    for row in rows:
        for key, value in row.items():
            if key.startswith(prefix) and value is not None:
                out[key[len(prefix):]] = max(out.get(key[len(prefix):], 0.0), value)
    return out


def measured_peaks(peaks: dict[str, float]) -> dict[str, float]:
    """GiB per plan phase from the trainer phases' peaks (`trainer_peaks`).

    >>> measured_peaks({"gen": 4.0, "ref": 1.0, "old_log_prob": 1.5, "update_actor": 2.0})
    {'rollout': 4.0, 'log_prob': 1.5, 'update': 2.0}
    """
    out = {}
    for phase, names in MEASURED.items():
        found = [peaks[n] for n in names if n in peaks]
        if found:
            out[phase] = max(found)
    return out


def compare(cfg, hf: dict, peaks: dict[str, float], gpu_bytes: float = 0.0,
            device_used: dict[str, float] | None = None) -> list[dict]:
    """One record per plan phase: predicted and measured GiB, their ratio and the predicted terms (one rank of
    the config's TP x PP x EP, DP 1). `peaks`: GiB per trainer phase (`trainer_peaks`). With SGLang the rollout's
    measure is the device's memory in use during the generation (`device_used["gen"]`): the engine's KV pool lives
    in its scheduler process, which this process's allocator does not see."""
    from rlhf_mcore.plan.params import Shape, experts_per_token
    from rlhf_mcore.plan.phases import phase_terms
    from rlhf_mcore.plan.static import Layout

    p = cfg.parallel
    terms = phase_terms(cfg, Shape.of(hf), Layout(p.tp, p.pp, p.ep, 1), gpu_bytes, 0,
                        experts_per_token(hf))
    measured = measured_peaks(peaks)
    if cfg.rollout.engine == "sglang":
        measured.pop("rollout", None)
        if (device_used or {}).get("gen"):
            measured["rollout"] = device_used["gen"]
    out = []
    for phase, t in terms.items():
        predicted, got = sum(t.values()) / GIB, measured.get(phase)
        out.append({"phase": phase, "predicted_gib": predicted, "measured_gib": got,
                    "ratio": predicted / got if got else None, "terms_gib": {k: v / GIB for k, v in t.items()}})
    return out


def repredict(result: dict) -> tuple[str, list[dict]]:
    """(the variant's name, `compare` records) of one bench result, with the plan of the code checked out."""
    from rlhf_mcore.config.load import from_dict

    saved = result.get("plan_input")
    if saved is None:
        raise ValueError(f"{result.get('system')}: no plan_input (tools/bench/bench_grpo_step.py writes it since "
                         "issue 42's run)")
    name = result.get("label") or result.get("system", "")
    return name, compare(from_dict(saved["config"]), saved["hf"], saved["phase_peaks_gib"],
                         saved.get("gpu_memory_gib", 0.0) * GIB, saved.get("device_used_gib"))


def read_results(path: Path) -> list[dict]:
    """A bench result file, or a JSON list of them (gpu_memory_plan.sh's memory_plan_runs.json)."""
    data = json.loads(path.read_text())
    return data if isinstance(data, list) else [data]


def result_files(paths: list[str]) -> list[Path]:
    """The bench result files named, a directory standing for its grpo_step_part_*.json files (one level down
    too: gpu_memory_plan.sh writes OUT/<variant>/)."""
    found = []
    for p in map(Path, paths):
        found += sorted(p.glob("grpo_step_part_*.json")) + sorted(p.glob("*/grpo_step_part_*.json")) \
            if p.is_dir() else [p]
    return found


def print_comparison(name: str, records: list[dict]) -> None:
    print(f"{name}: phase  predicted GiB  measured GiB  predicted/measured")
    nan = float("nan")
    for r in records:
        got, ratio = r["measured_gib"], r["ratio"]
        print(f"  {r['phase']:<13} {r['predicted_gib']:8.2f}  {got if got is not None else nan:12.2f}  "
              f"{ratio if ratio is not None else nan:8.3f}   " +
              " + ".join(f"{k} {v:.2f}" for k, v in r["terms_gib"].items()))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--metrics", default="")
    ap.add_argument("--repredict", nargs="+", default=[], help="bench result JSONs (or directories of them)")
    ap.add_argument("--config", default=None)
    ap.add_argument("--name", default="")
    ap.add_argument("--gpu-memory", type=float, default=0.0, help="GiB (for rollout.engine=sglang's fraction)")
    ap.add_argument("--out", default="")
    args, overrides = ap.parse_known_args(sys.argv[1:] if argv is None else argv)
    rows = []
    if args.repredict:
        for result in (r for path in result_files(args.repredict) for r in read_results(path)):
            name, records = repredict(result)
            print_comparison(name, records)
            rows += [{"variant": name, **r} for r in records]
    elif args.metrics:
        from rlhf_mcore.config.load import load_config
        from rlhf_mcore.models.transformer_config import load_hf_config

        cfg = load_config(args.config, overrides, check=False)
        steps = [json.loads(line) for line in open(args.metrics) if line.strip()]
        records = compare(cfg, load_hf_config(cfg.model), trainer_peaks(steps), args.gpu_memory * GIB)
        print_comparison(args.name or str(args.config), records)
        rows = [{"variant": args.name, **r} for r in records]
    else:
        ap.error("give --metrics (a run's metrics.jsonl) or --repredict (bench result files)")
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
