"""A training run's state and set-up: process groups, tokenizer, models, rollout engine, data, reward
scorer, KL controller, logs, checkpoints. `start_run` builds it; the trainer only calls its methods."""
from __future__ import annotations

import dataclasses
import json
import logging
import os
from pathlib import Path

import torch

from rlhf_mcore.algorithms.advantages import estimator_needs
from rlhf_mcore.algorithms.kl import KL_CONTROLLERS
from rlhf_mcore.config.load import dump_yaml
from rlhf_mcore.disk import disk_full_message, is_disk_full
from rlhf_mcore.logs import MetricLogger, init_logger, sink_errors
from rlhf_mcore.models.transformer_config import load_hf_config
from rlhf_mcore.parallel import init_distributed, torchrun_env
from rlhf_mcore.rollout.base import EngineSetup, build_rollout_engine
from rlhf_mcore.rollout.partial import max_lag
from rlhf_mcore.trainer.guards import (
    BadStepGuard,
    DiskFullError,
    DivergedError,
    RewardHealthGuard,
    RunStopped,
    StartupError,
)
from rlhf_mcore.trainer.inputs import build_samplers, load_run_tokenizer, stop_token_ids
from rlhf_mcore.trainer.lock import RunDirLocked, RunLock
from rlhf_mcore.trainer.phases import LossFns, build_loss_fns
from rlhf_mcore.trainer.roles import Roles, build_roles
from rlhf_mcore.trainer.scoring import Scorer
from rlhf_mcore.trainer.step_log import format_step_line

log = logging.getLogger("rlhf_mcore")
SUSPECT_SUFFIX = ".suspect"


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
    resume_path: str | None = None  # the verified checkpoint to resume from
    run_id: str | None = None  # rank 0: this run's id, recorded in run.json and every checkpoint.json
    lock: RunLock | None = None  # rank 0: the output directory's lock
    history: list = dataclasses.field(default_factory=list)
    bad_steps: BadStepGuard | None = None
    reward_health: RewardHealthGuard | None = None
    num_skipped_steps: int = 0
    hf_config: dict = dataclasses.field(default_factory=dict)  # the policy's architecture (perf/mfu/*)
    peak_flops: float | None = None  # the device's dense peak for model.dtype, None where unknown
    unconfirmed: str | None = None  # the newest checkpoint, until a step after it applies all its updates
    losses: LossFns | None = None  # the roles' loss functions, bound once (built from cfg/roles when None)
    rollout: object = None  # rlhf_mcore.rollout.modes.Rollout: rollout.mode over the engine (built when None)
    partial: object = None  # trainer.partial_rollout.PartialRollouts with async_training.partial_rollout, else None

    def __post_init__(self):
        if self.rollout is None:
            from rlhf_mcore.rollout.modes import build_rollout
            from rlhf_mcore.trainer.inputs import prompt_pixels

            self.rollout = build_rollout(self.cfg.rollout, self.engine, self.tokenizer, self.ctx,
                                         announce=self.ctx.is_logging_rank, images=prompt_pixels(self.cfg))
        if self.losses is None:
            self.losses = build_loss_fns(self.cfg, self.ctx, self.roles)
        if self.partial is None and self.cfg.async_training.partial_rollout:
            from rlhf_mcore.trainer.partial_rollout import PartialRollouts

            self.partial = PartialRollouts(self.cfg, self.tokenizer.pad_id, self.ctx.device,
                                           getattr(self.rollout, "engine", None),
                                           env=self.rollout.env if self.cfg.rollout.mode == "multi_turn" else None)
            if self.ctx.is_logging_rank:
                log.info(self.partial.describe())
        self.bad_steps = BadStepGuard(self.cfg.trainer.max_bad_steps, last_good_step=self.start_step)
        self.reward_health = RewardHealthGuard(self.cfg.reward.max_error_frac, self.cfg.reward.max_error_steps)

    @property
    def needs_greedy_baseline(self) -> bool:
        return estimator_needs(self.cfg.algorithm.adv_estimator).greedy_baseline

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

    @property
    def console(self) -> bool:
        """Rank 0 prints the step and validation lines when `trainer.logger` names `console`."""
        return self.ctx.is_logging_rank and "console" in self.cfg.trainer.logger

    def log_step(self, step: int, metrics: dict) -> None:
        self.history.append(metrics)
        if self.console:
            log.info(format_step_line(step, self.total_steps, metrics))
        self.metric_logger.write(step, metrics)

    def log_validation(self, step: int, record: bool = True) -> dict:
        """Validate and print its line; `record=False` leaves the metrics to the caller, who writes them in
        the step's own record (one JSONL record per step, as verl's)."""
        from rlhf_mcore.trainer.validation import validate

        metrics = validate(self, step)
        if self.console:
            log.info("validation @ step %d: %s", step, "  ".join(f"{k}={v:.4f}" for k, v in sorted(metrics.items())))
        if record:
            self.metric_logger.write(step, metrics)
            self.history.append({"step": step, **metrics})
        return metrics

    def save(self, step: int, final: bool = False) -> str | None:
        """Checkpoint `step`; None while the last step skipped an update (its weights are suspect). Older
        checkpoints go once this one is confirmed: at the next step that applies all its updates, or now for
        the final save of a healthy run (so weights that are finite but already diverged never push out the
        last good checkpoint: max_checkpoints_to_keep + 1 may be on disk in between)."""
        from rlhf_mcore.checkpoint import save_checkpoint, save_load

        if self.bad_steps.streak:
            log.warning("step %d: not saved: its update was skipped (non-finite)", step)
            return None
        if self.partial is not None:
            self.partial.on_save()  # in-flight samples are not part of a checkpoint (rollout/partial.py)
        extra = {"step": step, "sampler": self.sampler.state_dict(), "kl_ctrl": self.kl_ctrl.state_dict()}
        try:
            path = save_checkpoint(self.run_dir, step, self.roles.trainable(), extra, self.ctx,
                                   keep=self.cfg.trainer.max_checkpoints_to_keep if final else None,
                                   run_id=self.run_id)
            self.unconfirmed = None if final else path
            return path
        except save_load.NonFiniteWeightsError as e:
            raise DivergedError(f"training stopped at step {step}: {e}") from e
        except save_load.DiskFullError as e:
            raise DiskFullError(f"training stopped at step {step}: {e}") from e

    def check_health(self, step: int, metrics: dict) -> RunStopped | None:
        """Feed the guards this step's global metrics (adds their counters); the error to stop with, if any."""
        skipped = sum(metrics.get(f"{role}/skipped_update_frac", 0.0) for role in ("actor", "critic"))
        self.num_skipped_steps += skipped > 0
        metrics["training/num_skipped_steps"] = float(self.num_skipped_steps)
        rounds = int(metrics.get("filter_groups/num_gen_batches", 1))  # dynamic sampling scores several batches
        calls = self.cfg.data.train_batch_size * self.cfg.rollout.n * rounds
        failed = metrics.get("reward/errors", 0.0) + metrics.get("reward/timeouts", 0.0)
        metrics["reward/error_frac"] = failed / calls
        if skipped == 0:
            self._confirm_checkpoint()
        try:
            self.bad_steps.update(step, int(skipped > 0))
            self.reward_health.update(step, failed, calls)
        except RunStopped as e:
            if isinstance(e, DivergedError) and self.unconfirmed is not None:
                e.lines.append(self._set_aside_unconfirmed())
            return e
        return None

    def _confirm_checkpoint(self) -> None:
        if self.unconfirmed is not None and self.ctx.is_logging_rank:
            from rlhf_mcore.checkpoint.layout import prune, remove_orphans

            newest = Path(self.unconfirmed)
            prune(newest.parent, self.cfg.trainer.max_checkpoints_to_keep, newest=newest)
            remove_orphans(newest.parent)
        self.unconfirmed = None

    def _set_aside_unconfirmed(self) -> str:
        """The newest checkpoint led straight into non-finite steps: rename it so that resume=auto skips it."""
        path = Path(self.unconfirmed)
        aside = path.with_name(f"{path.name}{SUSPECT_SUFFIX}")
        if self.ctx.is_logging_rank:
            from rlhf_mcore.checkpoint.layout import list_checkpoints, write_latest

            path.rename(aside)
            remaining = list_checkpoints(path.parent)
            if remaining:
                write_latest(path.parent, remaining[-1][0])
        self.unconfirmed = None
        return (f"{path.name}: saved just before the first skipped update, set aside as {aside.name} (resume=auto "
                "takes the checkpoint before it; rename it back to use it).")

    def agree(self, flag: bool) -> bool:
        """True on every rank when it is True on rank 0 (ranks must stop at the same step)."""
        value = torch.tensor([1.0 if flag else 0.0], device=self.ctx.device)
        torch.distributed.broadcast(value, src=0)
        return bool(value.item())

    def close(self) -> None:
        self.metric_logger.close()
        if self.rollout is not None:
            self.rollout.close()  # the tool executor's workers (multi_turn)
        self.engine.shutdown()
        if self.lock is not None:
            self.lock.release()


def _total_steps(cfg, sampler) -> int:
    return cfg.trainer.total_steps or cfg.trainer.total_epochs * sampler.steps_per_epoch


def output_dir_error(out: str, err: OSError) -> str:
    """One line for a start-up write under trainer.output_dir that failed, naming the path.

    >>> print(output_dir_error("runs/x", PermissionError(13, "Permission denied", "runs/x/config.yaml"))[:78])
    trainer.output_dir=runs/x: cannot write runs/x/config.yaml (Permission denied)
    """
    if is_disk_full(err):
        return f"trainer.output_dir={out}: {disk_full_message(err, out)}"
    where = err.filename or out
    return (f"trainer.output_dir={out}: cannot write {where} ({err.strerror or err}). Fix its permissions, or set "
            "trainer.output_dir to a directory you can write.")


def _start_checks(cfg, ctx) -> tuple[RunLock | None, str | None, str | None]:
    """Before any model is built: rank 0 runs every preflight check, takes the output directory's lock and
    claims the directory (trainer/run_dir.py), all ranks share the verdict, then pick (and verify) the
    checkpoint to resume from; rank 0 records the run's id. Raises StartupError."""
    from rlhf_mcore.checkpoint import CheckpointError
    from rlhf_mcore.checkpoint.run_identity import begin_run
    from rlhf_mcore.checkpoint.verify import pick_resume
    from rlhf_mcore.trainer.preflight import preflight_errors
    from rlhf_mcore.trainer.run_dir import claim_run_dir

    lock, errors = None, []
    if ctx.is_logging_rank:
        errors = preflight_errors(cfg)
        try:
            lock = None if errors else RunLock(cfg.trainer.output_dir).acquire()
            errors = errors or claim_run_dir(cfg.trainer) or sink_errors(cfg.trainer.output_dir, cfg.trainer.logger)
        except RunDirLocked as e:
            errors = [str(e)]
        except OSError as e:
            errors = [output_dir_error(cfg.trainer.output_dir, e)]
    verdict = [errors]
    if ctx.dims.world_size > 1:
        torch.distributed.broadcast_object_list(verdict, src=0)
    try:
        if verdict[0]:
            raise StartupError(verdict[0])
        resume_path = pick_resume(cfg.trainer, cfg.trainer.output_dir)
        explicit = str(cfg.trainer.resume) not in ("auto", "disable", "restart")
        run_id = begin_run(cfg.trainer.output_dir, resume_path, explicit) if ctx.is_logging_rank else None
        return lock, resume_path, run_id
    except (CheckpointError, StartupError) as e:
        if lock is not None:
            lock.release()
        if isinstance(e, StartupError):
            raise
        raise StartupError(f"trainer.resume: {e}") from e


def _resume(run: Run) -> None:
    from rlhf_mcore.checkpoint import load_checkpoint

    path = run.resume_path
    if path is None:
        return
    extra = load_checkpoint(path, run.roles.trainable(), run.ctx, verify=False)  # verified by _start_checks
    run.sampler.load_state_dict(extra["sampler"])
    run.kl_ctrl.load_state_dict(extra["kl_ctrl"])
    run.start_step = int(extra["step"])
    log.info("resumed from %s at step %d", path, run.start_step)


def start_run(cfg) -> Run:
    rank, _, _ = torchrun_env()
    init_logger(rank)
    ctx = init_distributed(cfg.parallel.tp, cfg.parallel.pp, seed=cfg.trainer.seed,
                           timeout_min=cfg.parallel.collective_timeout_min, ep=cfg.parallel.ep)
    lock, resume_path, run_id = _start_checks(cfg, ctx)
    try:
        return _build_run(cfg, ctx, lock, resume_path, run_id)
    except BaseException:
        if lock is not None:
            lock.release()
        raise


def _build_run(cfg, ctx, lock: RunLock | None, resume_path: str | None, run_id: str | None) -> Run:
    from rlhf_mcore.checkpoint.layout import read_meta
    from rlhf_mcore.trainer.run_dir import write_config

    run_dir = cfg.trainer.output_dir
    if ctx.is_logging_rank:
        os.makedirs(run_dir, exist_ok=True)
        write_config(run_dir, dump_yaml(cfg))  # a changed config: named, and the previous one kept
    start_step = int(read_meta(resume_path)["step"]) if resume_path else 0
    tokenizer = load_run_tokenizer(cfg)
    stop_ids = stop_token_ids(cfg, tokenizer, announce=ctx.is_logging_rank)  # logged before any model
    hf_config = load_hf_config(cfg.model)
    roles = build_roles(cfg, hf_config, ctx)
    engine = build_rollout_engine(cfg.rollout, engine_setup(cfg, roles, hf_config, tokenizer, ctx))
    sampler, val_sampler = build_samplers(cfg, tokenizer, ctx)
    a = cfg.algorithm
    kl_args = {"value": a.kl_coef} if a.kl_ctrl_type == "fixed" else \
        {"value": a.kl_coef, "target_kl": a.target_kl, "horizon": a.kl_horizon}
    run = Run(cfg=cfg, ctx=ctx, roles=roles, engine=engine, tokenizer=tokenizer,
              stop_ids=stop_ids, sampler=sampler, hf_config=hf_config, peak_flops=_device_peak(cfg),
              val_sampler=val_sampler, scorer=Scorer(cfg, tokenizer, ctx),
              kl_ctrl=KL_CONTROLLERS.get(a.kl_ctrl_type)(**kl_args), total_steps=_total_steps(cfg, sampler),
              run_dir=run_dir, resume_path=resume_path, run_id=run_id, lock=lock, start_step=start_step,
              metric_logger=MetricLogger(run_dir, cfg.trainer.logger, ctx.is_logging_rank, truncate_after=start_step,
                                         project=cfg.trainer.project_name, name=cfg.trainer.experiment_name,
                                         config=dataclasses.asdict(cfg)))
    _resume(run)
    log.info(start_message(run.start_step, run.total_steps, run_dir))
    return run


def _device_peak(cfg) -> float | None:
    from rlhf_mcore.models.flops import peak_flops

    return peak_flops(torch.cuda.get_device_name(), cfg.model.dtype) if torch.cuda.is_available() else None


def start_message(start: int, total: int, run_dir: str) -> str:
    """What the run will do, or that a finished run has nothing left to do.

    >>> start_message(12, 12, "runs/x").split(";")[0]
    'run: already complete (step 12 of 12 in runs/x)'
    """
    if start >= total:
        return (f"run: already complete (step {start} of {total} in {run_dir}); nothing to train. Raise "
                "trainer.total_steps to continue, or set trainer.resume=restart to start over.")
    if start:
        return f"run: resuming at step {start} of {total}; {total - start} steps to go; output in {run_dir}"
    return f"run: {total} steps; output in {run_dir}"


def engine_setup(cfg, roles: Roles, hf_config: dict, tokenizer, ctx) -> EngineSetup:
    """What every rollout engine is built from, besides its own rollout.<engine> options."""
    replica_prompts = -(-cfg.data.train_batch_size // ctx.dims.dp)
    a = cfg.async_training  # partial rollouts decode staleness_threshold + 1 batches at once
    in_flight = max_lag(a.staleness_threshold) + 1 if a.partial_rollout else 1
    return EngineSetup(model=roles.actor.model[0], hf_config=hf_config, ctx=ctx, pad_id=tokenizer.pad_id,
                       decode=tokenizer.decode, micro_batch_size=cfg.rollout.micro_batch_size,
                       replica_rows=replica_prompts * cfg.rollout.n * in_flight, seed=cfg.trainer.seed,
                       record_routing=cfg.actor.router_replay == "R3", hf_dir=cfg.model.hf_path,
                       release_cache=plan_release_reason(cfg, ctx))


def plan_release_reason(cfg, ctx) -> str:
    """On a GPU with the memory plan checked (trainer.check_memory_plan): `cache_release_reason` for this device
    ('' for a config the plan gives no kept cache: SGLang, no graphs, keep_graphs=false)."""
    import torch

    if not (cfg.trainer.check_memory_plan and ctx.device.type == "cuda"):
        return ""
    from rlhf_mcore.plan.phases import cache_release_reason

    return cache_release_reason(cfg, torch.cuda.get_device_properties(ctx.device).total_memory, ctx.dims.world_size)


def finish_run(run: Run, last: int) -> None:
    """Final checkpoint, HF export of the actor, and a summary of where everything is. A run that was already
    complete names the checkpoint it resumed from, and redoes an export of it that never finished."""
    cfg = run.cfg
    saved = run.save(last, final=True) if cfg.trainer.save_freq != 0 and last > run.start_step else None
    path = saved or (run.resume_path if last == run.start_step else None)
    export = None
    if cfg.trainer.export_hf and path is not None:
        from rlhf_mcore.convert.export import export_actor_to_hf

        export = export_actor_to_hf(run, path, reuse=saved is None)
    if run.ctx.is_logging_rank:
        summary = {"run_dir": os.path.abspath(run.run_dir), "checkpoint": path, "hf_export": export,
                   "metrics": os.path.join(run.run_dir, "metrics.jsonl"), "run_id": run.run_id,
                   "step": last}
        with open(os.path.join(run.run_dir, "summary.json"), "w") as f:
            json.dump(summary, f, indent=2)
        log.info("done. run directory: %s | checkpoint: %s | HF export: %s | metrics: %s",
                 summary["run_dir"], path, export, summary["metrics"])
