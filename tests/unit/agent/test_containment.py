"""Start-up refuses sandboxed tools on a host that cannot contain them (agent/containment.py), names what is
missing and the opt-out key, and this host contains them. Every result the model reads is bounded, the cut
marker included."""
import pytest

from rlhf_mcore.agent import containment
from rlhf_mcore.agent.executor import ToolExecutor
from rlhf_mcore.agent.launch import Finished
from rlhf_mcore.agent.parsers import ToolCall
from rlhf_mcore.agent.tools import load_tools
from rlhf_mcore.config.schema import MultiTurnConfig
from rlhf_mcore.rollout.modes.build import sandbox_check


def test_this_host_contains_the_python_tool():
    done = containment.probe()
    assert done.status == "ok" and done.output.strip() == "contained"
    assert containment.gaps(done.layers) == []
    assert containment.containment_errors(["python"], allow_weak=False) == []


def weak(monkeypatch, layers):
    monkeypatch.setattr(containment, "probe", lambda: Finished("ok", "contained\n", layers=layers))


def test_a_host_without_namespaces_or_landlock_is_refused_in_one_line(monkeypatch):
    weak(monkeypatch, ["uid", "seccomp"])
    errors = containment.containment_errors(["python"], allow_weak=False)
    assert len(errors) == 1 and errors[0].startswith("rollout.multi_turn.tools: the python tool")
    assert "a private root" in errors[0] and "rollout.multi_turn.allow_weak_sandbox=true" in errors[0]
    assert containment.containment_errors(["python"], allow_weak=True) == []
    assert containment.containment_errors([], allow_weak=False) == []  # no sandboxed tool: nothing to ask


def test_the_rollout_build_refuses_it_too(monkeypatch):
    weak(monkeypatch, ["landlock"])
    tools = load_tools(["python", "calculator"], None)
    with pytest.raises(ValueError, match="seccomp allow-list"):
        sandbox_check(tools, MultiTurnConfig(tools=["python"]))
    sandbox_check(load_tools(["calculator"], None), MultiTurnConfig(tools=["calculator"]))  # in-process only


def test_a_sandbox_that_cannot_start_is_named(monkeypatch):
    monkeypatch.setattr(containment, "probe", lambda: Finished("crash", "sandbox: cannot build its private root",
                                                               error="the tool process exited with code 70"))
    errors = containment.containment_errors(["python"], allow_weak=True)
    assert len(errors) == 1 and "code 70" in errors[0]


@pytest.mark.parametrize("code", ["raise ValueError('x' * 100_000)", "print('y' * 100_000)",
                                  "import sys\nsys.stderr.write('z' * 100_000)\nimport os\nos._exit(3)"])
def test_every_result_is_bounded_with_its_marker(code):
    with ToolExecutor(load_tools(["python"], None), timeout_s=5, max_output_chars=300, memory_mb=512,
                      workers=1) as ex:
        r = ex.run([ToolCall("python", {"code": code})])[0]
    assert len(r.text) <= 300 and r.truncated and "characters cut" in r.text
