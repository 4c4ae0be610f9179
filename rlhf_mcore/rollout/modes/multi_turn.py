"""`rollout.mode=multi_turn`: assistant turns and tool calls, token in, token out.

Per sample (prompt x rollout.n), up to `rollout.multi_turn.max_turns` assistant turns:
1. `engine.generate` continues each running sample from its exact token prefix (the first turn samples
   the n samples of each prompt in one call, exactly as single_turn does; later turns one row per sample,
   each turn with its own seed derived from the step's). The tool call's end (`</tool_call>` for hermes)
   is a stop string; `max_new_tokens` is the largest remaining response budget, and a row's turn is cut
   to its own budget.
2. The sampled ids are appended as they are (loss mask 1). A turn that ends at a stop token (EOS, end of
   turn), at the budget, at the last allowed turn, or without a tool call ends the sample.
3. Its tool calls (parsed from the turn's decoded text; at most `max_tool_calls`, more get an error result)
   run through the tool executor, concurrently for all rows, on the replica's first rank only; results go
   to the replica's other TP/PP ranks by one broadcast, so every rank appends the same tokens.
4. The tool turn (end of the assistant message, tool messages, next generation prompt) is rendered by the
   chat template and encoded once (`rlhf_mcore.chat.tool_delta_ids`), appended with loss mask 0. When it
   does not fit the budget the sample ends there ("length"), so every sample ends on a policy token.

Every rank of a DP replica gets the same prompts and makes the same calls. DP replicas may run different
numbers of turns: neither engine's `generate` has a collective across DP replicas (native: TP all-gathers
and PP broadcasts inside the replica; sglang: an all-gather over the replica's ranks), so a replica that
is done early just stops calling it. The exception is the engine's `lockstep_group` (the native engine at
EP > 1: every MoE forward exchanges tokens over the expert group, whose ranks are DP replicas): before each
turn its ranks agree (one all-reduce) whether any of them still runs rows and on the turn's max_new_tokens
(the group's largest remaining budget), and a rank with no running rows calls `generate([])` with it, so
the all-to-alls meet (its engine runs padding forwards). Without such a group (EP 1, dense models, sglang)
there is no extra collective. A row's tools_kwargs (`extra_info.tools_kwargs[name]`, verl's
create_kwargs / execute_kwargs merged) reach tool `name` as its context with every call of that row.

Routing replay R3: each call returns the experts of every token of its rows (the prefill re-routes the prefix,
tool turns included), and each row keeps its last call's (`keep_routing`), which cover the whole row.

A vision LM's prompts carry their images into every turn (a later turn's row: its prompt's images, and the
prompt's length, past which an image id is text) and the batch carries them to the trainer. Tool results are text.
"""
from __future__ import annotations

import dataclasses

import torch
import torch.distributed as dist

from rlhf_mcore.chat import tool_delta_ids
from rlhf_mcore.rollout.modes.base import ROLLOUT_MODES, ModeEnv
from rlhf_mcore.rollout.modes.trajectory import Trajectory, assemble
from rlhf_mcore.rollout.types import RolloutBatch, SamplingParams
from rlhf_mcore.rollout.vision_decode import attach_images, row_images

TURN_SEED_STRIDE = 104_729  # a sample's later turns: distinct seeds (low bits too) from the step's first


def turn_seed(seed: int, turn: int) -> int:
    """The sampling seed of turn `turn` (turn 0 keeps the step's seed).

    >>> turn_seed(5, 0), turn_seed(5, 2)
    (5, 209463)
    """
    return seed + turn * TURN_SEED_STRIDE


def tools_kwargs(extra_info) -> dict:
    """verl's per-row tool arguments: {tool name: {"create_kwargs": {...}, "execute_kwargs": {...}}} ->
    {tool name: merged kwargs}.

    >>> tools_kwargs({"tools_kwargs": {"calc": {"create_kwargs": {"ground_truth": "4"}}}})
    {'calc': {'ground_truth': '4'}}
    """
    raw = (extra_info or {}).get("tools_kwargs") or {}
    return {name: {**(kw.get("create_kwargs") or {}), **(kw.get("execute_kwargs") or {})}
            for name, kw in raw.items() if isinstance(kw, dict)}


def sampled_turns(batch: RolloutBatch) -> list[tuple[list[int], list[float], str]]:
    """(sampled ids, log-probs, finish reason) of each row of one generate call."""
    tokens, logprobs = batch.tokens.tolist(), batch.rollout_logprobs.tolist()
    starts, lengths = batch.prompt_lengths.tolist(), batch.response_lengths.tolist()
    return [(tokens[i][s:s + n], logprobs[i][s:s + n], batch.finish_reasons[i])
            for i, (s, n) in enumerate(zip(starts, lengths))]


def agree_turn(group, device, num_active: int, budget: int) -> tuple[bool, int]:
    """(does any rank of the lockstep group still run rows, the turn's max_new_tokens: the group's largest
    remaining budget); this rank's own values without a group (no collective)."""
    if group is None:
        return num_active > 0, budget
    t = torch.tensor([num_active, budget], dtype=torch.long, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return bool(t[0] > 0), int(t[1])


def generate_turn(engine, prompts, trajs: list[Trajectory], active: list[int], params: SamplingParams,
                  turn: int, budget: int, show_progress: bool, images: list | None = None) -> RolloutBatch:
    """One turn's call: the n samples of each prompt at turn 0 (single_turn's call, so no tool call =
    single_turn; params.max_new_tokens, the same on every rank), then one row per running sample (none on a
    lockstep rank that is done) at `budget`. `images`: a vision LM's, per prompt (None: a text batch)."""
    if turn == 0:
        pictures = {} if images is None else {"images": images}
        return engine.generate([list(p.prompt_ids) for p in prompts], params, show_progress=show_progress,
                               **pictures)
    pictures = {} if images is None else {"images": [images[i // params.n] for i in active],  # row i: prompt i // n
                                          "prompt_lengths": [len(trajs[i].prompt) for i in active]}
    return engine.generate([trajs[i].prefix for i in active], dataclasses.replace(
        params, n=1, max_new_tokens=budget, seed=turn_seed(params.seed, turn)), show_progress=show_progress,
        **pictures)


def keep_routing(t: Trajectory, routed, j: int) -> None:
    """R3: row j of this call's experts (None without R3) become trajectory t's, cut to its tokens so far: the call
    re-routed t's whole prefix, so the last call's routing covers the finished row (`Trajectory.routing`)."""
    if routed is not None:
        t.routing = routed[j, :len(t.prompt) + len(t.response)]


def end_of_turn(t: Trajectory, ids: list[int], kept: list[int], stop_ids, last_turn: bool,
                sampled_end: bool = False) -> str:
    """Why the sample ends after this turn ("" when it may call tools): cut at or reaching its budget, a stop
    token, or the last allowed turn. `sampled_end` (turn_end=sampled): a turn that calls tools ends at a stop token
    (the end of turn, which the policy wrote), so a stop token ends the sample only at the last turn."""
    if len(kept) < len(ids) or t.remaining <= 0:
        return "length"
    stopped = bool(kept) and kept[-1] in stop_ids
    if stopped and (not sampled_end or last_turn):
        return "stop"
    return "length" if last_turn else ""


def run_calls(env: ModeEnv, calls: dict[int, list], max_calls: int,
              contexts: dict[int, dict]) -> dict[int, list[tuple[str, str | None, bool]]]:
    """{row: [(result text, error kind or None, timed out)]} for each row's calls: the first max_calls through
    the executor (all rows' at once, each with its row's tools_kwargs), the rest an error result unrun."""
    flat = [(row, c) for row, cs in calls.items() for c in cs[:max_calls]]
    results = env.executor.run([c for _, c in flat], [contexts.get(row) for row, _ in flat]) if flat else []
    out: dict[int, list] = {row: [] for row in calls}
    for (row, _), r in zip(flat, results):
        out[row].append((r.text, r.error, bool(r.timed_out)))
    for row, cs in calls.items():
        out[row] += [too_many_calls(max_calls, env.options.max_tool_response_chars)] * max(0, len(cs) - max_calls)
    return out


def too_many_calls(max_calls: int, max_chars: int) -> tuple[str, str, bool]:
    """The result of a call past a turn's first `max_calls` (it is not run), cut to `max_chars` like every result
    the model reads (the cut marker included).

    >>> too_many_calls(1, 10_000)[0]
    'Error: too many tool calls in one turn (at most 1); this call was not run.'
    >>> len(too_many_calls(1, 40)[0])
    40
    """
    from rlhf_mcore.agent.launch import cut_text

    text = f"Error: too many tool calls in one turn (at most {max_calls}); this call was not run."
    return cut_text(text, max_chars)[0], "too_many_calls", False


def tool_turns(env: ModeEnv, calls: dict[int, list], contexts: dict[int, dict]) -> dict[int, tuple[list[int], list]]:
    """{row: (tool-turn ids, [(text, error, timed out)])}: computed on the replica's first rank, shared."""
    group = getattr(getattr(env.ctx, "pgs", None), "mp", None)
    shared = group is not None and dist.is_initialized() and group.size() > 1
    payload = [None]
    if not shared or group.rank() == 0:
        results = run_calls(env, calls, env.options.max_tool_calls, contexts)
        payload = [{row: (tool_delta_ids(env.tokenizer, [text for text, _, _ in rs], env.sampled_end), rs)
                    for row, rs in results.items()}]
    if shared:
        dist.broadcast_object_list(payload, src=dist.get_process_group_ranks(group)[0], group=group)
    return payload[0]


def count_results(t: Trajectory, results: list) -> None:
    t.tool_calls += len(results)
    t.tool_errors += sum(error is not None for _, error, _ in results)
    t.tool_timeouts += sum(timed_out for _, _, timed_out in results)


@ROLLOUT_MODES.register("multi_turn")
def multi_turn(engine, prompts, params: SamplingParams, env: ModeEnv, show_progress: bool = False) -> RolloutBatch:
    opts = env.options
    rows = [(p, k) for p in prompts for k in range(params.n)]
    trajs = [Trajectory(list(p.prompt_ids), params.max_new_tokens) for p, _ in rows]
    row_kwargs = [tools_kwargs(p.extra_info) for p, _ in rows]
    stops = tuple(params.stop_strings) + tuple(s for s in env.stop_strings if s not in params.stop_strings)
    stop_ids, turn_params = set(params.stop_token_ids), dataclasses.replace(params, stop_strings=stops)
    group, device = getattr(engine, "lockstep_group", None), getattr(env.ctx, "device", "cpu")
    images = env.prompt_images(prompts)
    for turn in range(opts.max_turns):
        active = [i for i, t in enumerate(trajs) if not t.done]
        running, budget = agree_turn(group, device, len(active), max((trajs[i].remaining for i in active), default=0))
        if not running:
            break
        batch = generate_turn(engine, prompts, trajs, active, turn_params, turn, budget, show_progress, images)
        calls = {}
        for j, (i, (ids, logprobs, _)) in enumerate(zip(active, sampled_turns(batch))):
            t = trajs[i]
            kept = t.add_turn(ids, logprobs)
            keep_routing(t, batch.routed_experts, j)
            t.finish_reason = end_of_turn(t, ids, kept, stop_ids, last_turn=turn == opts.max_turns - 1,
                                          sampled_end=bool(env.sampled_end))
            if t.done:
                continue
            found = env.parse(env.tokenizer.decode(kept))
            if found:
                calls[i] = found
            else:
                t.finish_reason = "stop"
        contexts = {i: row_kwargs[i] for i in calls if row_kwargs[i]}
        for i, (ids, results) in (tool_turns(env, calls, contexts) if calls else {}).items():
            count_results(trajs[i], results)
            trajs[i].add_observation(ids)
    return attach_images(assemble(trajs, env.pad_id, device), images, row_images(images, params.n, len(prompts)),
                         device)
