"""A training run's state and set-up: process groups, tokenizer, models, rollout engine, data, reward
scorer, KL controller, logs, checkpoints. `start_run` builds it; the trainer only calls its methods."""
from __future__ import annotations

import dataclasses
import json
import logging
import os

import torch

from rlhf_mcore.algorithms import KL_CONTROLLERS
from rlhf_mcore.config_load import dump_yaml
from rlhf_mcore.config_validate import GREEDY_BASELINE_ESTIMATORS
from rlhf_mcore.logs import MetricLogger, init_logger
from rlhf_mcore.models.transformer_config import load_hf_config
from rlhf_mcore.parallel import init_distributed, torchrun_env
from rlhf_mcore.roles import Roles, build_roles
from rlhf_mcore.rollout.base import build_rollout_engine
from rlhf_mcore.run_data import build_samplers, load_run_tokenizer, stop_token_ids
from rlhf_mcore.run_reward import Scorer
from rlhf_mcore.step_log import format_step_line

log = logging.getLogger("rlhf_mcore")


@dataclasses.dataclass
class Run:
    cfg: object
    ctx: object
    roles: Roles
    engine: object
    tokenizer: object
    stop_ids: tuple
    sampler: object
    val_sampler: object
    scorer: Scorer
    kl_ctrl: object
    total_steps: int
    run_dir: str
    metric_logger: MetricLogger
    start_step: int = 0
    history: list = dataclasses.field(default_factory=list)

    @property
    def needs_greedy_baseline(self) -> bool:
        return self.cfg.algorithm.adv_estimator in GREEDY_BASELINE_ESTIMATORS

    @property
    def seq_len(self) -> int:
        return self.cfg.data.max_prompt_length + self.cfg.rollout.max_response_length

    def group_index(self, num_prompts: int) -> torch.Tensor:
        """[num_prompts * n] global prompt ids: samples of one prompt share a group on every layout."""
        first = self.ctx.dp_rank * num_prompts
        ids = torch.arange(first, first + num_prompts, device=self.ctx.device)
        return ids.repeat_interleave(self.cfg.rollout.n)

    def rows_per_mini(self, role: str) -> int:
        return getattr(self.cfg, role).ppo_mini_batch_size * self.cfg.rollout.n // self.ctx.dims.dp

    def log_step(self, step: int, metrics: dict) -> None:
        self.history.append(metrics)
        if self.ctx.is_logging_rank:
            log.info(format_step_line(step, self.total_steps, metrics))
        self.metric_logger.write(step, metrics)

    def log_validation(self, step: int) -> dict:
        from rlhf_mcore.run_validate import validate

        metrics = validate(self)
        if self.ctx.is_logging_rank:
            log.info("validation @ step %d: %s", step, "  ".join(f"{k}={v:.4f}" for k, v in sorted(metrics.items())))
        self.metric_logger.write(step, metrics)
        self.history.append({"step": step, **metrics})
        return metrics

    def save(self, step: int) -> str:
        from rlhf_mcore.checkpoint import save_checkpoint

        extra = {"step": step, "sampler": self.sampler.state_dict(), "kl_ctrl": self.kl_ctrl.state_dict()}
        return save_checkpoint(self.run_dir, step, self.roles.trainable(), extra, self.ctx,
                               keep=self.cfg.trainer.max_checkpoints_to_keep)

    def agree(self, flag: bool) -> bool:
        """True on every rank when it is True on rank 0 (ranks must stop at the same step)."""
        value = torch.tensor([1.0 if flag else 0.0], device=self.ctx.device)
        torch.distributed.broadcast(value, src=0)
        return bool(value.item())

    def close(self) -> None:
        self.metric_logger.close()
        if hasattr(self.engine, "shutdown"):
            self.engine.shutdown()


def _total_steps(cfg, sampler) -> int:
    return cfg.trainer.total_steps or cfg.trainer.total_epochs * sampler.steps_per_epoch


def _resume(run: Run) -> None:
    if run.cfg.trainer.resume == "disable":
        return
    from rlhf_mcore.checkpoint import load_checkpoint, resolve_resume

    path = resolve_resume(run.cfg.trainer, run.run_dir)
    if path is None:
        return
    extra = load_checkpoint(path, run.roles.trainable(), run.ctx)
    run.sampler.load_state_dict(extra["sampler"])
    run.kl_ctrl.load_state_dict(extra["kl_ctrl"])
    run.start_step = int(extra["step"])
    log.info("resumed from %s at step %d", path, run.start_step)


def start_run(cfg) -> Run:
    rank, _, _ = torchrun_env()
    init_logger(rank)
    ctx = init_distributed(cfg.parallel.tp, cfg.parallel.pp, seed=cfg.trainer.seed)
    run_dir = cfg.trainer.output_dir
    if ctx.is_logging_rank:
        os.makedirs(run_dir, exist_ok=True)
        with open(os.path.join(run_dir, "config.yaml"), "w") as f:
            f.write(dump_yaml(cfg))
    tokenizer = load_run_tokenizer(cfg)
    roles = build_roles(cfg, load_hf_config(cfg.model), ctx)
    engine = build_rollout_engine(cfg.rollout.engine, **engine_kwargs(cfg, roles, tokenizer, ctx))
    sampler, val_sampler = build_samplers(cfg, tokenizer, ctx)
    a = cfg.algorithm
    kl_args = {"value": a.kl_coef} if a.kl_ctrl_type == "fixed" else \
        {"value": a.kl_coef, "target_kl": a.target_kl, "horizon": a.kl_horizon}
    run = Run(cfg=cfg, ctx=ctx, roles=roles, engine=engine, tokenizer=tokenizer,
              stop_ids=stop_token_ids(cfg, tokenizer), sampler=sampler,
              val_sampler=val_sampler, scorer=Scorer(cfg, tokenizer, ctx),
              kl_ctrl=KL_CONTROLLERS.get(a.kl_ctrl_type)(**kl_args), total_steps=_total_steps(cfg, sampler),
              run_dir=run_dir, metric_logger=MetricLogger(
                  run_dir, cfg.trainer.logger, ctx.is_logging_rank, cfg.trainer.project_name,
                  cfg.trainer.experiment_name, dataclasses.asdict(cfg)))
    _resume(run)
    log.info(start_message(run.start_step, run.total_steps, run_dir))
    return run


def start_message(start: int, total: int, run_dir: str) -> str:
    """What the run will do, or that a finished run has nothing left to do.

    >>> start_message(12, 12, "runs/x").split(";")[0]
    'run: already complete (step 12 of 12 in runs/x)'
    """
    if start >= total:
        return (f"run: already complete (step {start} of {total} in {run_dir}); nothing to train. Raise "
                "trainer.total_steps to continue, or set trainer.resume=disable to start over.")
    if start:
        return f"run: resuming at step {start} of {total}; {total - start} steps to go; output in {run_dir}"
    return f"run: {total} steps; output in {run_dir}"


def engine_kwargs(cfg, roles: Roles, tokenizer, ctx) -> dict:
    kwargs = dict(model=roles.actor.model[0], ctx=ctx, pad_id=tokenizer.pad_id, decode=tokenizer.decode)
    if cfg.rollout.engine == "native":
        kwargs["micro_batch_size"] = cfg.rollout.micro_batch_size
    else:
        kwargs["cfg"] = cfg
    return kwargs


def finish_run(run: Run, last: int) -> None:
    """Final checkpoint, HF export of the actor, and a summary of where everything is."""
    cfg = run.cfg
    path = run.save(last) if cfg.trainer.save_freq != 0 and last > run.start_step else None
    export = None
    if cfg.trainer.export_hf and path is not None:
        from rlhf_mcore.checkpoint.export import export_actor_to_hf

        export = export_actor_to_hf(run, path)
    if run.ctx.is_logging_rank:
        summary = {"run_dir": os.path.abspath(run.run_dir), "checkpoint": path, "hf_export": export,
                   "metrics": os.path.join(run.run_dir, "metrics.jsonl")}
        with open(os.path.join(run.run_dir, "summary.json"), "w") as f:
            json.dump(summary, f, indent=2)
        log.info("done. run directory: %s | checkpoint: %s | HF export: %s | metrics: %s",
                 summary["run_dir"], path, export, summary["metrics"])
