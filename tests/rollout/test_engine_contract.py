"""Every registered rollout engine implements the whole contract of `rollout.base.RolloutEngine`, and config
validation asks the engine which training layouts it can roll out with."""
from types import SimpleNamespace as N

import pytest

from rlhf_mcore.rollout.base import ROLLOUT_ENGINES, RolloutEngine

MEMBERS = ("generate", "update_weights", "release_memory", "resume_memory", "shutdown", "layout_errors")


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
    assert sglang.layout_errors(layout(sp=True)) == []
    (err,) = sglang.layout_errors(layout(pp=2))
    assert err.startswith("rollout.engine: sglang runs one engine per GPU") and "(got tp=1, pp=2)" in err
