"""YAML + `a.b=value` overrides -> a typed `Config`, with every error collected and reported at once.

Errors have the form "<dotted.key>: <problem> (got <value>). <how to fix>." An unknown key is an error
with a did-you-mean suggestion, never a warning.
"""
from __future__ import annotations

import dataclasses
import json
import os
import types
import typing
from typing import Any

import yaml

from rlhf_mcore.config import verl_keys
from rlhf_mcore.config.schema import MOVED_KEYS, Config
from rlhf_mcore.config.yaml_strict import YamlError, load_strict, read_config_file
from rlhf_mcore.registry import suggest

FILE_LIST_KEYS = ("data.train_files", "data.val_files")  # comma-separated paths; list forms are joined


class ConfigError(ValueError):
    """All problems found in one config, one line each."""

    def __init__(self, errors: list[str]):
        self.errors = errors
        super().__init__("invalid config:\n" + "\n".join(f"  - {e}" for e in errors))


def _field_types(cls) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def all_keys(cls=Config, prefix: str = "") -> list[str]:
    """Every dotted leaf key of the schema (the golden-list test freezes this)."""
    keys = []
    for name, tp in _field_types(cls).items():
        if dataclasses.is_dataclass(tp):
            keys += all_keys(tp, f"{prefix}{name}.")
        else:
            keys.append(f"{prefix}{name}")
    return keys


def _type_name(tp) -> str:
    return getattr(tp, "__name__", str(tp)).replace("typing.", "")


def coerce(key: str, value: Any, tp) -> Any:
    """Convert a YAML or command-line value to the field's type, or raise ValueError with the key."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):  # Optional[X]
        if value is None or (isinstance(value, str) and value.lower() in ("null", "none")):
            return None
        (inner,) = [a for a in typing.get_args(tp) if a is not type(None)]
        return coerce(key, value, inner)
    if origin is list:
        (inner,) = typing.get_args(tp)
        if isinstance(value, str):
            value = _inline_list(key, value) if value.strip().startswith("[") else [v for v in value.split(",") if v]
        if not isinstance(value, list):
            raise ValueError(f"{key}: expected a list (got {value!r}). Write it as [a, b] or a,b.")
        return [coerce(f"{key}[{i}]", v, inner) for i, v in enumerate(value)]
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
            return value.lower() in ("true", "1", "yes")
        raise ValueError(f"{key}: expected true or false (got {value!r}). Write true or false.")
    if tp in (int, float):
        return _number(key, value, tp)
    if tp is str:
        if isinstance(value, (dict, list)):
            raise ValueError(f"{key}: expected a string (got {value!r}). Write a single value.")
        return "" if value is None else str(value)
    raise ValueError(f"{key}: unsupported field type {_type_name(tp)}")


def _inline_list(key: str, value: str) -> Any:
    """`[a, b]` written on the command line, parsed as YAML; a syntax error names the key.

    >>> _inline_list("trainer.logger", "[console")
    Traceback (most recent call last):
    ...
    ValueError: trainer.logger: not a valid list (got '[console'). Write it as [a, b] or a,b.
    """
    try:
        return load_strict(value)
    except YamlError:
        raise ValueError(f"{key}: not a valid list (got {value!r}). Write it as [a, b] or a,b.") from None


def _number(key: str, value: Any, tp):
    fix = "Write a whole number." if tp is int else "Write a number."
    if isinstance(value, bool) or isinstance(value, (list, dict)) or value is None:
        raise ValueError(f"{key}: expected {tp.__name__} (got {value!r}). {fix}")
    try:
        number = float(value)
    except ValueError:
        raise ValueError(f"{key}: expected {tp.__name__} (got {value!r}). {fix}") from None
    if tp is float:
        return number
    if not number.is_integer():
        raise ValueError(f"{key}: expected int (got {value!r}). {fix}")
    if abs(number) >= 2**63:
        raise ValueError(f"{key}: does not fit a 64-bit integer (got {value!r}). Write a smaller whole number.")
    return int(number)


def _unknown_key(dotted: str, key: str, value: Any, types_: dict, where: str) -> str:
    """The error for a key the schema lacks: where it moved to, or the closest valid key.

    >>> _unknown_key("rollout.cuda_graphs", "cuda_graphs", False, {}, "here")
    "rollout.cuda_graphs: unknown key, moved to rollout.native.cuda_graphs (got False). Did you mean \
'rollout.native.cuda_graphs'? Set that key instead."
    """
    if dotted in MOVED_KEYS:
        new = MOVED_KEYS[dotted]
        return f"{dotted}: unknown key, moved to {new} (got {value!r}). Did you mean '{new}'? Set that key instead."
    return f"{dotted}: unknown key (got {value!r}).{suggest(key, types_)} Valid keys {where}: {', '.join(types_)}."


def _build(cls, data: dict, prefix: str, errors: list[str]):
    """Instantiate dataclass `cls` from a nested dict, collecting errors instead of raising."""
    types_ = _field_types(cls)
    kwargs = {}
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        if key not in types_:
            errors.append(_unknown_key(dotted, key, value, types_, "here"))
            continue
        tp = types_[key]
        if dataclasses.is_dataclass(tp):
            if not isinstance(value, dict):
                errors.append(f"{dotted}: expected a section of keys (got {value!r}). Write it as a mapping.")
                continue
            kwargs[key] = _build(tp, value, f"{dotted}.", errors)
            continue
        try:
            kwargs[key] = coerce(dotted, value, tp)
        except ValueError as e:
            errors.append(str(e))
    return cls(**kwargs)


def _set_dotted(data: dict, dotted: str, value: str, errors: list[str]) -> None:
    parts = dotted.split(".")
    cls, node = Config, data
    for i, part in enumerate(parts):
        types_ = _field_types(cls)
        if part not in types_:
            where = ".".join(parts[:i]) or "top level"
            errors.append(_unknown_key(dotted, part, value, types_, f"under {where}"))
            return
        if i == len(parts) - 1:
            if dataclasses.is_dataclass(types_[part]):
                errors.append(f"{dotted}: is a section, not a value (got {value!r}). Override one of its keys.")
                return
            node[part] = value
            return
        cls = types_[part]
        if not dataclasses.is_dataclass(cls):
            errors.append(f"{dotted}: {'.'.join(parts[: i + 1])} is a value, not a section (got {value!r}).")
            return
        node = node.setdefault(part, {})


def _file_list(value: Any) -> Any:
    """A list of files as one comma-separated string: [a, b], "['a','b']" (verl's form) or "a,b".

    >>> _file_list("['a.parquet','b.parquet']"), _file_list(["a", "b"]), _file_list("a")
    ('a.parquet,b.parquet', 'a,b', 'a')
    """
    if isinstance(value, str) and value.strip().startswith("["):
        try:
            value = load_strict(value)
        except YamlError:
            return value
    return ",".join(map(str, value)) if isinstance(value, (list, tuple)) else value


def _set(data: dict, dotted: str, value: Any, errors: list[str], notes: list[str], our_keys: set) -> None:
    """Set one key, ours or verl's (translated with a note, `verl_keys`)."""
    if verl_keys.is_verl_key(dotted, our_keys):
        pairs, note, error = verl_keys.translate(dotted, value)
        errors += [error] if error else []
        notes += [note] if note else []
        if dotted in verl_keys.CUSTOM_REWARD:  # path and name make one key of ours
            current = (data.get("reward") or {}).get("custom_fn", "") if isinstance(data.get("reward"), dict) else ""
            pairs = [("reward.custom_fn", verl_keys.custom_reward_fn(current, dotted, value))]
    else:
        pairs = [(dotted, value)]
    for key, val in pairs:
        _set_dotted(data, key, _file_list(val) if key in FILE_LIST_KEYS else val, errors)


def parse_overrides(overrides: list[str], data: dict, errors: list[str], notes: list[str] | None = None) -> None:
    """a.b=value overrides into `data`; Hydra's forms as verl's scripts write them: +a.b=value (add) and ++a.b=value
    set the key like a.b=value, ~a.b (delete) puts its default back."""
    notes = [] if notes is None else notes
    our_keys = set(all_keys())
    errors += verl_keys.layout_conflicts(o.lstrip("+").split("=", 1) for o in overrides if "=" in o)
    for item in overrides:
        item = item.lstrip("+")
        if item.startswith("~"):
            _delete_dotted(data, item[1:].split("=", 1)[0].strip())
            continue
        if "=" not in item:
            errors.append(f"{item}: an override must look like a.b=value (got {item!r}). Add =value.")
            continue
        key, value = item.split("=", 1)
        _set(data, key.strip(), value, errors, notes, our_keys)


def _delete_dotted(data: dict, dotted: str) -> None:
    """Hydra's ~key: the key's default again (nothing to do where the file did not set it)."""
    *parents, last = dotted.split(".")
    node = data
    for part in parents:
        node = node.get(part) if isinstance(node, dict) else None
    if isinstance(node, dict):
        node.pop(last, None)


HYDRA_HEADERS = ("defaults", "hydra")  # verl's YAML files compose verl's own configs through them


def _apply_yaml_aliases(data: dict, errors: list[str], notes: list[str]) -> None:
    """A YAML file may use verl's keys too (their overrides file): translate them, and join file lists."""
    our_keys = set(all_keys())
    found = verl_keys.extract_verl(data, our_keys)
    errors += verl_keys.layout_conflicts(found)
    for dotted, value in found:
        _set(data, dotted, value, errors, notes, our_keys)
    section = data.get("data")
    if isinstance(section, dict):
        for key in ("train_files", "val_files"):
            if key in section:
                section[key] = _file_list(section[key])


CRITIC_INHERITS = ("ppo_mini_batch_size", "micro_batch_size_per_gpu", "use_dynamic_bsz", "max_tokens_per_gpu")


def _inherit_critic_batching(data: dict, notes: list[str]) -> None:
    """The critic's batching keys left unset take the actor's, as verl's critic config does (its
    ppo_mini_batch_size is ${actor.ppo_mini_batch_size}), so that a verl-shaped command line makes as many
    critic optimizer steps as actor ones. A note names what was taken when a critic is trained."""
    actor, critic = data.get("actor"), data.get("critic")
    if not isinstance(actor, dict) or (critic is not None and not isinstance(critic, dict)):
        return  # the schema check reports the bad section
    critic = data.setdefault("critic", {}) if critic is None else critic
    taken = [f"{key}={actor[key]}" for key in CRITIC_INHERITS if key in actor and key not in critic]
    for key in CRITIC_INHERITS:
        if key in actor and key not in critic:
            critic[key] = actor[key]
    algorithm = data.get("algorithm") if isinstance(data.get("algorithm"), dict) else {}
    if taken and _trains_a_critic(str(algorithm.get("adv_estimator", "gae"))):
        notes.append(f"critic: unset batching keys take the actor's ({', '.join(taken)}), as in verl; set "
                     "critic.<key> to choose otherwise")


def _trains_a_critic(estimator: str) -> bool:
    from rlhf_mcore.algorithms.advantages import estimator_needs

    try:
        return estimator_needs(estimator).critic
    except Exception:  # noqa: BLE001 - an unknown estimator is reported by the config rules
        return False


def load_config(path: str | None = None, overrides: list[str] = (), world_size: int | None = None,
                check: bool = True, notes: list[str] | None = None) -> Config:
    """Read YAML, apply overrides, check every rule (only types and names with check=False); raise ConfigError
    listing all problems. Without a path the defaults are the base. `notes` (if given) receives one line per
    verl key translated or ignored (`verl_keys`)."""
    notes = [] if notes is None else notes
    from rlhf_mcore.config.validate import validate

    errors: list[str] = []
    data: dict = {}
    if path:
        try:
            data = read_config_file(path) or {}
        except FileNotFoundError:
            raise ConfigError([f"--config: file not found (got {path!r}). Pass a YAML from configs/."]) from None
        except OSError as e:
            raise ConfigError([f"--config: cannot read {path} ({e.strerror}) (got {path!r}). Pass a readable "
                               "YAML file."]) from None
        except YamlError as e:
            raise ConfigError([str(e)]) from None
        if not isinstance(data, dict):
            raise ConfigError([f"--config: {path} must hold a mapping of sections (got {type(data).__name__})."])
        headers = [key for key in HYDRA_HEADERS if data.pop(key, None) is not None]
        if headers:
            notes.append(f"--config: Hydra's {' and '.join(headers)} header skipped: verl's own configs are not "
                         "composed here (ours are the defaults); the file's keys are read")
        _apply_yaml_aliases(data, errors, notes)
    parse_overrides(list(overrides), data, errors, notes)
    _inherit_critic_batching(data, notes)
    if str(data.get("trainer", {}).get("save_freq", "")).strip() == "-1":
        notes.append("trainer.save_freq=-1 saves at the end only (verl's -1 never saves: set 0 for that)")
    cfg = _build(Config, data, "", errors)
    if not errors and check:
        errors += cfg.section_errors() + validate(cfg, world_size)
    if errors:
        raise ConfigError(errors)
    return cfg


def to_dict(cfg) -> dict:
    return dataclasses.asdict(cfg)


def from_dict(data: dict, overrides: list[str] = ()) -> Config:
    """A `Config` from `to_dict`'s form (e.g. a record's saved config) with `a.b=value` overrides; types and names
    checked (ConfigError lists every problem), not the cross-field rules."""
    import copy

    errors: list[str] = []
    data = copy.deepcopy(data)
    parse_overrides(list(overrides), data, errors)
    cfg = _build(Config, data, "", errors)
    if errors:
        raise ConfigError(errors)
    return cfg


def dump_yaml(cfg) -> str:
    """The config as it will run. With model.hf_path the architecture comes from its config.json: those
    fields are left out of the model section (they would be ignored) and shown below it as comments."""
    data = to_dict(cfg)
    resolved = _hf_model_fields(cfg.model)
    if resolved is None:
        return yaml.safe_dump(data, sort_keys=False)
    for key in resolved:
        data["model"].pop(key, None)
    model = yaml.safe_dump({"model": data.pop("model")}, sort_keys=False)
    lines = [f"  # read from {os.path.join(cfg.model.hf_path, 'config.json')}:"]
    lines += [f"  #   {line}" for line in yaml.safe_dump(resolved, sort_keys=False).splitlines()]
    return model + "\n".join(lines) + "\n" + yaml.safe_dump(data, sort_keys=False)


def _hf_model_fields(model) -> dict | None:
    """The architecture fields as config.json sets them, or None without a readable hf_path."""
    from rlhf_mcore.models.hf_fields import model_fields_from_hf

    path = os.path.join(model.hf_path, "config.json") if model.hf_path else ""
    if not path or not os.path.isfile(path):
        return None
    try:
        with open(path) as f:
            return model_fields_from_hf(json.load(f), path, model.init_std)
    except (OSError, ValueError):  # unreadable or unsupported: the config check reports it
        return None
