"""``--backward`` on a port holding its weights as buffers (``ports/weights_as_buffers.py``).

Its forward agrees, and no gradient can reach a weight: the backward fails, and says why
in its own words. It said "its forward ran under no_grad, or detached its outputs", drew
a table of no rows whose title wrapped mid-phrase ("(0" / "FAIL, 0 drift)"), and ended on
"parity FAILS in the backward: forward and backward (0 parameters)" in green.
"""

from __future__ import annotations

from tests.adversarial.corpus import PORTS


def test_a_port_of_buffers_fails_the_backward_and_says_why(tiny_folder, capsys):
    from introspect.cli.main import main

    got = main(["diff", "--model", str(tiny_folder), "--candidate",
                f"{PORTS / 'weights_as_buffers.py'}:frozen", "--backward"])
    out, err = capsys.readouterr()
    assert got == 1, out + err
    assert "the forward holds" in out
    assert "the candidate holds no parameters (its weights are buffers" in out, out
    assert "parameters: no weight's gradient compared" in out
    assert "weights' gradients (0" not in out
    assert out.rstrip().splitlines()[-1] == "parity FAILS in the backward (0 parameters)"
