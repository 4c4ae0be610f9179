"""`train(cfg)`: the RL loop, one SPMD program on every rank. `train_step` reads top to bottom:
rollout -> rewards -> old/ref log-probs and values -> advantages -> critic and actor updates -> weight
refresh -> log."""
from __future__ import annotations

import time
from functools import partial

from rlhf_mcore.logs import timer
from rlhf_mcore.parallel import torchrun_env
from rlhf_mcore.trainer import phases
from rlhf_mcore.trainer.dumps import sample_records, write_records
from rlhf_mcore.trainer.dynamic_sampling import fill_batch
from rlhf_mcore.trainer.losses import actor_loss
from rlhf_mcore.trainer.metrics import reduce_outputs
from rlhf_mcore.trainer.optim import lr_at
from rlhf_mcore.trainer.profiler import profile_step
from rlhf_mcore.trainer.rollout_memory import rollout_memory, sync_weights
from rlhf_mcore.trainer.run import Run, finish_run, start_run
from rlhf_mcore.trainer.signals import ExitSignals, agree_stop, stop_on_signal
from rlhf_mcore.trainer.step_log import mfu_metrics, step_metrics


def rollout_round(run: Run, step: int, timings: dict, round_index: int = 0) -> tuple:
    """Phases 1-2 on the next prompt batch: generate, score -> (batch, reward metrics, per-sample values)."""
    cfg = run.cfg
    async_report = None
    params = phases.sampling_params(cfg, run.stop_ids, step, round_index=round_index)
    with timer("gen", timings), rollout_memory(run):  # the rollout layer (rollout.mode) calls the engine
        if run.partial is not None:  # async_training.partial_rollout: the groups that finished first
            prompts, rollout, async_report = run.partial.generate(run.rollout, run.sampler.next_batch, params, step)
        else:
            prompts = run.sampler.next_batch()
            rollout = run.rollout.generate(prompts, params, show_progress=run.ctx.is_logging_rank)
        baseline = phases.greedy_baseline(run.rollout, run.scorer, prompts, cfg, run.stop_ids, step) \
            if run.needs_greedy_baseline else None
    with timer("reward", timings):
        batch, metrics, values = phases.score(run, rollout, prompts, baseline)
    if cfg.trainer.rollout_data_dir:  # verl's dump of what the model wrote, per step
        columns = {k: values[k].tolist() for k in ("reward", "acc", "format")}
        write_records(cfg.trainer.rollout_data_dir, step + 1, sample_records(
            rollout, prompts, cfg.rollout.n, run.tokenizer.decode, columns, step + 1), run.ctx)
    if async_report is not None:
        metrics.update(reduce_outputs([async_report], run.ctx))
    return batch, metrics, values


def train_step(run: Run, step: int) -> dict:
    cfg, ctx, roles, losses, timings = run.cfg, run.ctx, run.roles, run.losses, {}
    generate = partial(rollout_round, run, step, timings)
    batch, reward_metrics = fill_batch(run, generate(), generate, timings)  # more rounds: algorithm.filter_groups
    with timer("reward", timings):
        batch = phases.balance_dp(batch, cfg, ctx, [run.rows_per_mini(r) for r in roles.trainable()])
    on_policy = run.partial is None and phases.is_on_policy(cfg, batch.num_rows, run.rows_per_mini("actor"))
    batch = phases.forward_passes(roles, losses, batch, cfg, ctx, timings, on_policy)  # old/ref log-probs, values
    with timer("adv", timings):
        batch, mismatch_metrics = phases.rollout_correction(batch, cfg)
        batch, adv_metrics, reward_kl = phases.compute_advantages(batch, cfg, run.kl_ctrl.value, ctx)
    reports = [mismatch_metrics]  # reduced over DP with the loss functions' reports (trainer/metrics.py)
    lrs = {f"{r}/lr": lr_at(step, getattr(cfg, r).optim, run.total_steps) for r in ("actor", "critic")}
    if roles.critic is not None:
        with timer("update_critic", timings):
            reports += phases.update_role("critic", roles.critic, batch, losses.critic, cfg.critic,
                                          run.rows_per_mini("critic"), lrs["critic/lr"],
                                          phases.micro_batching(cfg, cfg.critic))
    else:
        del lrs["critic/lr"]
    if step >= cfg.trainer.critic_warmup:  # verl's critic warm-up: the actor waits for a value baseline
        with timer("update_actor", timings):
            reports += phases.update_role("actor", roles.actor, batch, losses.actor, cfg.actor,
                                          run.rows_per_mini("actor"), lrs["actor/lr"],
                                          phases.micro_batching(cfg, cfg.actor), first_loss_fn=losses.actor_first)
    with timer("sync_weights", timings):  # also hands the engine its memory back
        sync_metrics = sync_weights(run)
    extra = {**reward_metrics, **adv_metrics, **sync_metrics, **lrs, "training/global_step": step + 1}
    metrics = step_metrics(batch, reduce_outputs(reports, ctx), extra, timings, ctx,
                           max_response_length=cfg.rollout.max_response_length)
    metrics.update(mfu_metrics(metrics, run.hf_config, cfg, ctx.dims.world_size, run.peak_flops))
    if reward_kl is not None:  # KL in the reward: the controller adapts its coefficient to the measured KL
        run.kl_ctrl.update(float(reward_kl), cfg.data.train_batch_size * cfg.rollout.n)
    return metrics


def out_of_time(cfg, started: float) -> bool:
    return cfg.trainer.time_limit_min > 0 and time.perf_counter() - started > 60 * cfg.trainer.time_limit_min


def train(cfg) -> Run:
    # a signal is noted; a second one (after trainer.repeat_signal_window_s) exits at once
    with ExitSignals(rank=torchrun_env()[0], repeat_window_s=cfg.trainer.repeat_signal_window_s) as signals:
        return _train(cfg, signals)


def _train(cfg, signals: ExitSignals) -> Run:
    started = time.perf_counter()
    run = start_run(cfg)
    run.losses = phases.build_loss_fns(cfg, run.ctx, run.roles, update_loss=actor_loss)  # bound once
    t = cfg.trainer
    try:
        if (t.val_before_train or t.val_only) and run.val_sampler is not None:
            run.log_validation(run.start_step)
        if t.val_only:  # verl's trainer.val_only: nothing is trained or saved
            return run
        step = run.start_step
        signals.arm()  # from here a signal waits for the end of the step (before, it exits at once)
        while step < run.total_steps:
            start = time.perf_counter()
            with profile_step(t, step + 1, run.ctx.rank):
                metrics = train_step(run, step)
            metrics["timing_s/step"] = time.perf_counter() - start
            step += 1
            stop = run.check_health(step, metrics)  # the same verdict on every rank (global metrics)
            timed_out, signum, by_rank = (False, 0, -1) if step == run.total_steps or stop is not None else \
                agree_stop(run.ctx, out_of_time(cfg, started), signals)  # one all-reduce: every rank's verdict
            last = step == run.total_steps or timed_out
            if stop is None and not signum and run.val_sampler is not None and t.test_freq > 0 and \
                    (step % t.test_freq == 0 or last):
                metrics.update(run.log_validation(step, record=False))  # in this step's record
            run.log_step(step, metrics)
            if stop is not None:
                raise stop
            if signum:
                raise stop_on_signal(run, step, signum, by_rank)  # save this step, then exit (trainer/signals.py)
            if t.save_freq > 0 and step % t.save_freq == 0 and not last:
                run.save(step)
            if last:
                break
        finish_run(run, step)
    finally:
        run.close()
    return run
