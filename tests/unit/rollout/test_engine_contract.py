"""Every registered rollout engine implements the whole contract of `rollout.base.RolloutEngine`, and config
validation asks the engine which training layouts it can roll out with."""
from types import SimpleNamespace as N

import pytest

from rlhf_mcore.rollout.base import ROLLOUT_ENGINES, RolloutEngine

MEMBERS = ("build", "generate", "update_weights", "release_memory", "resume_memory", "shutdown", "layout_errors",
           "memory_errors")


@pytest.mark.parametrize("name", ROLLOUT_ENGINES.names())
def test_engine_has_every_member_of_the_protocol(name):
    engine = ROLLOUT_ENGINES.get(name)
    assert set(MEMBERS) <= {m for m in dir(RolloutEngine) if not m.startswith("_")}
    for member in MEMBERS:
        assert callable(getattr(engine, member, None)), (name, member)


def layout(tp=1, pp=1, sp=False):
    return N(tp=tp, pp=pp, sequence_parallel=sp)


def test_engines_declare_their_layouts():
    native, sglang = ROLLOUT_ENGINES.get("native"), ROLLOUT_ENGINES.get("sglang")
    assert native.layout_errors(layout(tp=2, pp=2)) == []
    (err,) = native.layout_errors(layout(tp=2, sp=True))
    assert err.startswith("parallel.sequence_parallel: the native rollout engine cannot decode with it")
    for parallel in (layout(sp=True), layout(pp=2), layout(tp=2, pp=2)):  # one engine per GPU, any layout
        assert sglang.layout_errors(parallel) == []


@pytest.mark.parametrize("name", ROLLOUT_ENGINES.names())
def test_engine_declares_its_config_section(name):
    """Each engine's options are one sub-section rollout.<section>, a dataclass of the schema."""
    import dataclasses

    from rlhf_mcore.config import RolloutConfig
    from rlhf_mcore.rollout.base import engine_options

    section = ROLLOUT_ENGINES.traits(name).section
    assert dataclasses.is_dataclass(getattr(RolloutConfig(), section))
    assert engine_options(RolloutConfig(engine=name)) is not None
