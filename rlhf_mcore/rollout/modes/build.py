"""`build_rollout(rollout_cfg, engine, tokenizer, ctx)`: the run's rollout layer, built once at start-up."""
from __future__ import annotations

import dataclasses
import logging

from rlhf_mcore.rollout.modes.base import ModeEnv, Rollout

log = logging.getLogger("rlhf_mcore")
PARSER_STOPS = {"hermes": ("</tool_call>",)}  # where a tool call ends: a stop string of every assistant turn


def parser_fn(name: str):
    """The tool-call parser `name` as a text -> calls function, and the stop strings that end a call."""
    from rlhf_mcore.agent.parsers import TOOL_CALL_PARSERS

    parser = TOOL_CALL_PARSERS.get(name)
    stops = tuple(getattr(parser, "stop_strings", ())) or PARSER_STOPS.get(name, ())
    return getattr(parser, "parse", parser), stops


def tool_env(options, tokenizer, ctx, pad_id: int) -> ModeEnv:
    """The multi-turn environment: tools, parser and (on the replica's first rank) the tool executor."""
    from rlhf_mcore.agent.executor import ToolExecutor
    from rlhf_mcore.agent.tools import load_tools

    tools = load_tools(list(options.tools), options.tools_file or None)
    parse, stops = parser_fn(options.parser)
    mp = getattr(getattr(ctx, "pgs", None), "mp", None)
    first = mp is None or mp.rank() == 0
    executor = None
    if first:
        sandbox_check(tools, options)
        executor = ToolExecutor(tools, timeout_s=options.tool_timeout_s,
                                max_output_chars=options.max_tool_response_chars, memory_mb=options.tool_memory_mb,
                                workers=options.workers, disk_mb=options.tool_disk_mb)
    sampled = options.turn_end == "sampled"
    return ModeEnv(tokenizer=tokenizer, ctx=ctx, options=options, tools=tools, executor=executor, parse=parse,
                   stop_strings=() if sampled else stops, pad_id=pad_id,
                   sampled_end=end_of_turn_text(tokenizer) if sampled else "")


def end_of_turn_text(tokenizer) -> str:
    """The text of the token the chat template writes after every assistant message (`stop_tokens`)."""
    from rlhf_mcore.stop_tokens import end_of_turn_token

    special = getattr(tokenizer, "special_tokens", None) or {}
    token = end_of_turn_token(lambda m: tokenizer.apply_chat_template(m, add_generation_prompt=False), special)
    if token is None:
        raise ValueError("rollout.multi_turn.turn_end: 'sampled' needs a chat template that ends every assistant "
                         "message with one special token (got none). Use rollout.multi_turn.turn_end=template.")
    return tokenizer.decode([token], skip_special_tokens=False)


def sandbox_check(tools: dict, options) -> None:
    """Refuse sandboxed tools on a host that cannot contain them (unless allowed); log once what holds."""
    from rlhf_mcore.agent.containment import containment_errors, probe

    names = sorted(name for name, t in tools.items() if t.sandboxed)
    errors = containment_errors(names, options.allow_weak_sandbox)
    if errors:
        raise ValueError(errors[0])
    if names:
        log.info("tool sandbox: %s (layers that hold: %s)", ", ".join(names), ", ".join(probe().layers))


def build_rollout(rollout_cfg, engine, tokenizer, ctx, announce: bool = False, images=None) -> Rollout:
    """single_turn: the engine alone (with `images`, a vision LM's prompts -> pixels); multi_turn: with the tools
    of rollout.multi_turn. Logs which path runs."""
    if rollout_cfg.mode != "multi_turn":
        if announce:
            log.info("rollout: %s mode (one generate call per step, %s engine%s)", rollout_cfg.mode,
                     rollout_cfg.engine, ", prompts with their images" if images is not None else "")
        return Rollout(engine, rollout_cfg.mode, ModeEnv(images=images))
    m = rollout_cfg.multi_turn
    env = dataclasses.replace(tool_env(m, tokenizer, ctx, tokenizer.pad_id), images=images)
    if announce:
        log.info("rollout: multi_turn mode (%s engine; up to %d assistant turns, %d tool calls per turn, tools %s, "
                 "%s parser, stop strings %s, tool time-out %g s, output cut at %d chars, %d workers; the loss "
                 "mask trains only the sampled tokens%s)", rollout_cfg.engine, m.max_turns, m.max_tool_calls,
                 ", ".join(env.tools) or "none", m.parser, list(env.stop_strings), m.tool_timeout_s,
                 m.max_tool_response_chars, m.workers, "; prompts with their images" if images is not None else "")
    return Rollout(engine, "multi_turn", env)
