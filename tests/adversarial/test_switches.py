"""A build that flips a process-wide switch is judged by values (issue 41): a note naming
the switch when neither model's values depend on it, exit 2 naming the port's build when
the reference's do or a model cannot run under it, FAIL when the candidate parts from the
reference with the switch put back (``introspect.run.switches``)."""

from __future__ import annotations

import sys

import pytest
import torch

import introspect
from introspect.errors import InputError
from introspect.run import switches
from introspect.run.deferred import Deferred
from tests import launch
from tests.adversarial.corpus import PORTS, port

_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


@pytest.fixture(autouse=True)
def switches_kept():
    """Every switch as it was before each test: a build here flips them in this process."""
    before = switches.snapshot()
    yield
    for name, value in before.items():
        switches.SWITCHES[name][1](value)


def test_a_flipped_switch_is_read_put_back_and_restored():
    before = switches.snapshot()
    torch.backends.mha.set_fastpath_enabled(False)
    torch.set_grad_enabled(False)
    changed = switches.flipped(before, switches.snapshot())
    assert changed == {"attention fast path": ("on", "off"), "grad mode": ("on", "off")}
    assert switches.describe(changed) == "grad mode (on -> off), attention fast path (on -> off)"
    with switches.put_back(before):
        assert torch.backends.mha.get_fastpath_enabled() and torch.is_grad_enabled()
    assert not torch.backends.mha.get_fastpath_enabled() and not torch.is_grad_enabled()


@pytest.mark.parametrize("builder, switch", [("fastpath_off", "attention fast path (on -> off)"),
                                             ("grad_off", "grad mode (on -> off)")])
def test_a_switch_no_value_reads_gets_a_verdict_and_a_note(tiny, builder, switch):
    reference, inputs = tiny
    build = getattr(port("switch_builds.py"), builder)
    candidate = Deferred(lambda: build(reference), label=f"switch_builds.py:{builder}")
    result = introspect.diff(reference.model, candidate, inputs)
    assert result.passed
    said = [n for n in result.notes if "build switched" in n]
    assert len(said) == 1 and switch in said[0] and "put back, agrees too" in said[0]


def test_no_sdpa_backend_names_the_ports_build_in_one_line(tiny):
    reference, inputs = tiny
    build = port("switch_builds.py").no_sdpa
    candidate = Deferred(lambda: build(reference), label="switch_builds.py:no_sdpa")
    with pytest.raises(InputError, match=r"^the switch_builds.py:no_sdpa's build switched "
                                         r"sdpa backends \(.* -> none\) process-wide"):
        introspect.diff(reference.model, candidate, inputs)


def test_no_sdpa_backend_through_the_cli_is_one_line_and_exit_2(tiny_folder):
    done = launch.run([sys.executable, "-m", "introspect", "diff", "--model",
                       str(tiny_folder), "--candidate",
                       f"{PORTS / 'switch_builds.py'}:no_sdpa", "-q"],
                      capture_output=True, text=True, timeout=300,
                      env={**__import__("os").environ, **_ENV})
    assert done.returncode == 2, done.stdout + done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("introspect diff:")]
    assert len(errors) == 1 and "Traceback" not in done.stderr
    assert "build switched sdpa backends" in errors[0]
    assert "No viable backend for scaled_dot_product_attention" in errors[0]


def test_no_sdpa_backend_for_the_reference_alone_names_the_build_before_any_replay(tiny):
    """The port never calls sdpa; the reference cannot run under the switch: exit 2 naming
    the build, before an fx replay of the reference prints its own traceback."""
    reference, inputs = tiny
    build = port("switch_builds.py").no_sdpa_own_attention
    candidate = Deferred(lambda: build(reference), label="own_attention")
    with pytest.raises(InputError, match=r"^the own_attention's build switched sdpa backends "
                                         r".*and the reference cannot run under it \("
                                         r"RuntimeError: No viable backend"):
        introspect.diff(reference.model, candidate, inputs)
