"""Generate the verl golden outputs that tests/unit/algorithms/test_verl_parity.py compares against.

Runs verl's OWN `verl/trainer/ppo/core_algos.py` (and `rollout_corr_helper.py`, `utils/torch_functional.py`,
`utils/groupwise.py`) at a pinned commit on seeded float64 inputs, and stores inputs + outputs in
golden.pt next to this file. verl is not needed at test time. Heavy imports verl pulls in (omegaconf,
tensordict, its config dataclasses, DataProto) are replaced by small stubs; the maths is verl's source.

    git clone https://github.com/volcengine/verl /tmp/verl   # or any git dir holding the commit
    python tests/unit/algorithms/verl_golden/gen_golden.py --verl-git-dir /tmp/verl/.git

Known verl defect worked around: `kl_penalty("k3+")` raises (kl_penalty_forward does not strip the "+"),
so the goldens of the "+" names come from verl's kl_penalty with kl_penalty_forward given the base name.
"""
from __future__ import annotations

import argparse
import importlib
import os
import re
import subprocess
import sys
import tempfile
import types
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from cases import ACTOR, CASES, OTB_ZERO_TAIL, POLICY_VARIANTS, VALUE_MODES, make_case  # noqa: E402

COMMIT = "b178a3cd56f58b2d502255daba591e92833930a7"
FILES = ("verl/trainer/ppo/core_algos.py", "verl/trainer/ppo/rollout_corr_helper.py",
         "verl/utils/torch_functional.py", "verl/utils/groupwise.py")
DEFAULTS_FILE = "verl/trainer/config/_generated_ppo_trainer.yaml"  # verl's own flattening of ppo_trainer.yaml
DEFAULTS_PREFIXES = {"actor_rollout_ref.actor.": "actor.", "actor_rollout_ref.rollout.": "rollout.",
                     "critic.": "critic.", "algorithm.": "algorithm."}


class _Cfg(dict):
    """Attribute + .get access, like verl's OmegaConf/dataclass configs."""

    __getattr__ = dict.get


def _stub(name: str, **attrs) -> None:
    mod = types.ModuleType(name)
    mod.__dict__.update(attrs)
    mod.__path__ = []  # a package, so submodules can be stubbed too
    sys.modules[name] = mod


def load_verl(git_dir: str, commit: str, workdir: str):
    """Extract verl's files at `commit` into workdir, stub the rest of the package, import core_algos."""
    for path in FILES:
        text = subprocess.run(["git", "--git-dir", git_dir, "show", f"{commit}:{path}"], check=True,
                              capture_output=True, text=True).stdout
        target = Path(workdir, path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    for pkg in ("verl", "verl/utils", "verl/trainer", "verl/trainer/ppo"):
        Path(workdir, pkg, "__init__.py").touch()
    Path(workdir, "verl/utils/__init__.py").write_text("from .groupwise import as_torch_index, group_mean_std\n")
    sys.path.insert(0, workdir)

    class ActorConfig(_Cfg):
        pass

    class AlgoConfig(_Cfg):
        pass

    class DataProto:
        def __init__(self, batch):
            self.batch = batch

        @classmethod
        def from_dict(cls, tensors):
            return cls(dict(tensors))

    _stub("omegaconf", DictConfig=dict)
    _stub("tensordict", TensorDict=dict)
    _stub("verl.utils.device", get_device_name=lambda: "cpu", get_torch_device=lambda: torch.cpu,
          is_npu_available=False, is_cuda_available=False)
    _stub("verl.utils.import_utils", deprecated=lambda *a, **k: (lambda fn: fn))
    _stub("verl.trainer.config", AlgoConfig=AlgoConfig)
    _stub("verl.trainer.config.algorithm", RolloutCorrectionConfig=_Cfg)
    _stub("verl.workers")
    _stub("verl.workers.config", ActorConfig=ActorConfig)
    _stub("verl.workers.config.actor", PolicyLossConfig=_Cfg)
    _stub("verl.protocol", DataProto=DataProto)
    core = importlib.import_module("verl.trainer.ppo.core_algos")
    return core, ActorConfig, AlgoConfig


def run_advantages(core, AlgoConfig, c: dict) -> dict:
    r, m, idx = c["token_level_rewards"], c["response_mask"], c["index"].numpy()
    scores_r = c["outcome_rewards"]
    out = {}

    def put(name, fn):
        adv, ret = fn()
        out[f"adv/{name}"] = {"advantages": adv.clone(), "returns": ret.clone()}

    for gamma, lam in ((1.0, 1.0), (0.99, 0.95)):
        put(f"gae/{gamma}/{lam}", lambda: core.compute_gae_advantage_return(r, c["values"], m, gamma, lam))
    for norm in (True, False):
        put(f"grpo/{norm}", lambda: core.compute_grpo_outcome_advantage(
            scores_r.clone(), m, idx, norm_adv_by_std_in_grpo=norm))
        if c["min_group"] >= 2:
            put(f"grpo_passk/{norm}", lambda: core.compute_grpo_passk_outcome_advantage(
                scores_r.clone(), m, idx, config=AlgoConfig(norm_adv_by_std_in_grpo=norm)))
    put("rloo", lambda: core.compute_rloo_outcome_advantage(scores_r.clone(), m, idx))
    put("opo", lambda: core.compute_opo_outcome_advantage(scores_r.clone(), m, idx))
    put("gpg", lambda: core.compute_gpg_outcome_advantage(scores_r.clone(), m, idx))
    put("reinforce_plus_plus_baseline", lambda: core.compute_reinforce_plus_plus_baseline_outcome_advantage(
        scores_r.clone(), m, idx))
    for gamma in (1.0, 0.9):
        put(f"reinforce_plus_plus/{gamma}", lambda: core.compute_reinforce_plus_plus_outcome_advantage(
            r, m, config=AlgoConfig(gamma=gamma)))
    put("remax", lambda: core.compute_remax_outcome_advantage(r, c["reward_baselines"], m))
    fns = {"optimal_token_baseline": core.compute_optimal_token_baseline_advantage,
           "tir_optimal_token_baseline": core.compute_multi_turn_optimal_token_baseline_advantage}
    for name, zero_tail in OTB_ZERO_TAIL.items():
        for use_is in (False, True):
            put(f"{name}/{use_is}", lambda: fns[name](
                r, m, idx, c["old_log_probs"], c["sum_pi_squared"],
                rollout_is_weights=c["rollout_is_weights"] if use_is else None, handle_zero_tail=zero_tail))
    return out


def run_policy_losses(core, ActorConfig, c: dict) -> dict:
    out = {}
    for name, mode, use_is, extra in POLICY_VARIANTS:
        logp = c["log_prob"].clone().requires_grad_(True)
        policy_loss = _Cfg(clip_cov_ratio=1.0, clip_cov_lb=1.0, clip_cov_ub=5.0, kl_cov_ratio=0.2, ppo_kl_coef=1.0,
                           rollout_correction=_Cfg(extra) if name == "bypass_mode" else None)
        cfg = ActorConfig(**ACTOR, policy_loss=policy_loss, global_batch_info={})
        old = c["rollout_log_probs"] if name == "bypass_mode" else c["old_log_prob"]
        loss, metrics = core.get_policy_loss_fn(name)(
            old, logp, c["pg_advantages"], c["response_mask"], loss_agg_mode=mode, config=cfg,
            rollout_is_weights=c["rollout_is_weights"] if use_is else None)
        (grad,) = torch.autograd.grad(loss, logp)
        key = f"pg/{name}/{mode}/{use_is}/{extra.get('loss_type', '')}/{extra.get('rollout_is', '')}"
        out[key] = {"loss": loss.detach(), "grad": grad,
                    **{k: torch.tensor(float(v), dtype=torch.float64) for k, v in metrics.items()
                       if k in ("actor/pg_clipfrac", "actor/ppo_kl", "actor/pg_clipfrac_lower")}}
    return out


def run_kl(core, c: dict) -> dict:
    out = {}
    base = core.kl_penalty_forward
    for name in ("k1", "kl", "abs", "k2", "mse", "k3", "low_var_kl"):
        for plus in ("", "+"):
            logp = c["log_prob"].clone().requires_grad_(True)
            if plus:  # verl's straight-through, with its forward given the base name (see module docstring)
                core.kl_penalty_forward = lambda a, b, kind: base(a, b, kind.rstrip("+"))
            try:
                value = core.kl_penalty(logp, c["ref_log_prob"], name + plus)
            finally:
                core.kl_penalty_forward = base
            (grad,) = torch.autograd.grad((value * c["response_mask"]).sum(), logp)
            out[f"kl/{name}{plus}"] = {"value": value.detach(), "grad": grad}
    return out


def run_aggregation_and_value(core, c: dict) -> dict:
    out = {}
    m = c["response_mask"]
    for mode in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"):
        scale = {"loss_scale_factor": 64} if mode == "seq-mean-token-sum-norm" else {}
        out[f"agg/{mode}"] = {"loss": core.agg_loss(c["loss_mat"], m, mode, **scale)}
    variants = [(0.2, "", torch.float64, "token-mean"), (0.5, "", torch.float64, "token-mean"),
                (0.2, "critic_", torch.float32, "token-mean")]
    variants += [(0.2, "", torch.float64, mode) for mode in VALUE_MODES]  # critic.loss_agg_mode
    for clip, prefix, dtype, mode in variants:
        vpreds = c[f"{prefix}vpreds"].to(dtype).requires_grad_(True)
        returns, values = c[f"{prefix}returns"].to(dtype), c[f"{prefix}values"].to(dtype)
        loss, clipfrac = core.compute_value_loss(vpreds, returns, values, m.to(dtype), clip, loss_agg_mode=mode)
        (grad,) = torch.autograd.grad(loss, vpreds)
        name = f"value/{clip}" + ("/fp32" if dtype == torch.float32 else "") + \
            ("" if mode == "token-mean" else f"/{mode}")
        out[name] = {"loss": loss.detach().double(), "vf_clipfrac": clipfrac.detach().double(), "grad": grad.double()}
    return out


def _flatten(node, prefix: str, out: dict) -> dict:
    for key, value in node.items():
        if isinstance(value, dict):
            _flatten(value, f"{prefix}{key}.", out)
        else:
            out[f"{prefix}{key}"] = value
    return out


def read_defaults(git_dir: str, commit: str) -> tuple[dict, dict]:
    """verl's config defaults at `commit`, as (resolved, raw) {dotted key: scalar} under our section names
    (actor., rollout., critic., algorithm.). `${oc.select:key,default}` resolves to that key's value, else the
    default, as OmegaConf does; other interpolations stay raw strings."""
    import yaml

    text = subprocess.run(["git", "--git-dir", git_dir, "show", f"{commit}:{DEFAULTS_FILE}"], check=True,
                          capture_output=True, text=True).stdout
    flat = _flatten(yaml.safe_load(text), "", {})
    select = re.compile(r"\$\{oc\.select:([\w.]+),(.*)\}")

    def resolve(value):
        match = select.fullmatch(value) if isinstance(value, str) else None
        if match is None:
            return value
        fallback = yaml.safe_load(match.group(2)) if match.group(2) else None
        return resolve(flat.get(match.group(1), fallback))

    resolved, raw = {}, {}
    for key, value in flat.items():
        for theirs, ours in DEFAULTS_PREFIXES.items():
            if key.startswith(theirs):
                resolved[ours + key[len(theirs):]] = resolve(value)
                raw[ours + key[len(theirs):]] = value
    return resolved, raw


def run_kl_controllers(core) -> dict:
    adaptive = core.AdaptiveKLController(init_kl_coef=0.05, target_kl=0.1, horizon=10000)
    fixed = core.FixedKLController(kl_coef=0.05)
    values = []
    for current_kl, n_steps in ((0.3, 256), (0.05, 256), (0.11, 512), (0.0, 1024), (2.0, 64)):
        adaptive.update(current_kl, n_steps)
        fixed.update(current_kl, n_steps)
        values.append((adaptive.value, fixed.value))
    return {"kl_ctrl": {"adaptive": torch.tensor([v[0] for v in values], dtype=torch.float64),
                        "fixed": torch.tensor([v[1] for v in values], dtype=torch.float64)}}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--verl-git-dir", required=True)
    parser.add_argument("--commit", default=COMMIT)
    parser.add_argument("--out", default=str(HERE / "golden.pt"))
    args = parser.parse_args()
    torch.set_default_dtype(torch.float64)
    with tempfile.TemporaryDirectory() as workdir:
        core, ActorConfig, AlgoConfig = load_verl(args.verl_git_dir, args.commit, workdir)
        golden = {"commit": args.commit, "cases": {}, "results": {}}
        for case_name, spec in CASES.items():
            c = make_case(**spec)
            golden["cases"][case_name] = c
            res = {**run_advantages(core, AlgoConfig, c), **run_policy_losses(core, ActorConfig, c),
                   **run_kl(core, c), **run_aggregation_and_value(core, c)}
            golden["results"][case_name] = res
        golden["results"]["controllers"] = run_kl_controllers(core)
    golden["defaults"], golden["defaults_raw"] = read_defaults(args.verl_git_dir, args.commit)
    torch.save(golden, args.out)
    num = sum(len(v) for v in golden["results"].values())
    print(f"wrote {args.out}: {num} results from verl {args.commit} ({os.path.getsize(args.out)} bytes)")


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
