"""What a port can do to the run itself, and verdicts no single node's error decides.

- a build that damages the reference in place: one line, exit 2 (never a verdict);
- a build that calls ``sys.exit(0)``: exit 2, never 0 (CI would read 0 as green);
- two files both named port.py in two folders: each runs its own code;
- a forward that stores ``self.scores``: passes twice, and leaves no fx Proxy behind;
- RMSNorm eps 1e-5 instead of 1e-6 (llama-tiny) and LayerNorm eps 1e-5 instead of 1e-6
  (BERT), two HF models and no port: FAIL (drift that no local error is over budget for);
- correct bf16 and fp16 ports (cast copies of the reference): PASS under --noise-budget.
"""

from __future__ import annotations

import copy
import sys

import pytest
import torch

from introspect.cli.main import main
from tests import launch
from tests.adversarial.corpus import PORTS, port
from tests.adversarial.test_corpus import set_eps
from tests.adversarial.test_verdicts import cli
from tests.refusals import shows


def test_a_build_that_damages_the_reference_is_refused(tiny_folder, capsys):
    spec = f"{PORTS / 'damages_reference.py'}:build"
    try:
        code = main(["diff", "--model", str(tiny_folder), "--candidate", spec, "-q"])
    except SystemExit as e:
        code = ("SystemExit", e.code)
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and "Traceback" not in err and shows(spec, err)


def test_a_build_that_calls_sys_exit_0_ends_in_exit_2(tiny_folder, capsys):
    spec = f"{PORTS / 'exits.py'}:build"
    try:
        code = main(["diff", "--model", str(tiny_folder), "--candidate", spec, "-q"])
    except SystemExit as e:
        code = ("SystemExit", e.code)
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and "Traceback" not in err and shows(spec, err)


@pytest.mark.slow
def test_sys_exit_0_through_the_real_cli_is_exit_2(tiny_folder):
    done = launch.run([sys.executable, "-m", "introspect", "diff", "--model",
                       str(tiny_folder), "-q", "--candidate", f"{PORTS}/exits.py:build"],
                      capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and done.stdout == "", (done.returncode, done.stdout)
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr


def test_two_files_named_port_py_each_run_their_own_code(tiny_folder, capsys):
    good, bad = (f"{PORTS / folder / 'port.py'}:build"
                 for folder in ("same_name_a", "same_name_b"))
    codes = [cli(str(tiny_folder), spec, capsys) for spec in (good, bad, bad, good)]
    assert codes == [0, 1, 1, 0]


def test_two_files_named_port_py_as_reference_and_candidate_fail(tiny_folder, capsys):
    """Both sides are ports: a correct one as the reference, the faulty one as candidate."""
    good, bad = (f"{PORTS / folder / 'port.py'}:build"
                 for folder in ("same_name_a", "same_name_b"))
    codes = []
    for reference, candidate in ((good, bad), (bad, good)):
        codes.append(main(["diff", "--model", str(tiny_folder), "--reference", reference,
                           "--candidate", candidate, "-q"]))
        capsys.readouterr()
    assert codes == [1, 1]


def test_a_forward_storing_scores_passes_twice_in_the_cli(tiny_folder, capsys):
    spec = f"{PORTS / 'stores_scores.py'}:correct"
    assert [cli(str(tiny_folder), spec, capsys) for _ in range(2)] == [0, 0]


def test_a_forward_storing_scores_passes_twice_and_keeps_no_proxy(tiny):
    import introspect

    reference, inputs = tiny
    model = port("stores_scores.py").correct(reference)
    verdicts = [introspect.diff(reference.model, model, inputs).passed for _ in range(2)]
    left = {type(getattr(block, "scores", None)).__name__ for block in model.blocks}
    assert verdicts == [True, True] and left <= {"Tensor", "NoneType"}, left


def test_rmsnorm_eps_one_decade_off_fails_on_llama(llama_tiny):
    import introspect

    reference, inputs = llama_tiny
    wrong = set_eps(copy.deepcopy(reference.model), 1e-5)  # 1e-6 in the reference
    assert introspect.diff(reference.model, wrong, inputs).passed is False


def test_rmsnorm_eps_one_decade_off_fails_on_llama_in_the_cli(llama_tiny, tmp_path, capsys):
    reference, _ = llama_tiny
    set_eps(copy.deepcopy(reference.model), 1e-5).save_pretrained(tmp_path / "eps")
    reference.tokenizer.save_pretrained(tmp_path / "eps")
    code = main(["diff", "--model", "llama-tiny", "--candidate", str(tmp_path / "eps"), "-q"])
    capsys.readouterr()
    assert code == 1


@pytest.fixture(scope="module")
def bert_eps_folders(tiny, tmp_path_factory):
    """The perturbed bert-tiny saved with every LayerNorm eps at 1e-6, and at 1e-5."""
    reference, _ = tiny
    folders = {}
    for eps in (1e-6, 1e-5):
        folder = tmp_path_factory.mktemp(f"bert-eps-{eps:g}")
        set_eps(copy.deepcopy(reference.model), eps).save_pretrained(folder)
        reference.tokenizer.save_pretrained(folder)
        folders[eps] = folder
    return folders


def test_layernorm_eps_one_decade_off_fails_on_bert(bert_eps_folders, capsys):
    import introspect
    from introspect.models.load import load_model, tokenize

    six, five = (load_model(str(bert_eps_folders[eps])) for eps in (1e-6, 1e-5))
    assert five.model.encoder.layer[1].output.LayerNorm.eps == 1e-5
    assert introspect.diff(six.model, five.model, tokenize(six.tokenizer)).passed is False
    code = main(["diff", "--model", str(bert_eps_folders[1e-6]), "--candidate",
                 str(bert_eps_folders[1e-5]), "-q"])
    capsys.readouterr()
    assert code == 1


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_correct_low_precision_ports_pass(dtype, tiny, tiny_folder, capsys):
    import introspect

    spec = f"{PORTS / 'cast.py'}:{dtype}"
    assert cli(str(tiny_folder), spec, capsys, "--noise-budget") == 0
    reference, inputs = tiny
    candidate = getattr(port("cast.py"), dtype)(reference)
    assert next(candidate.parameters()).dtype == getattr(torch, dtype)
    assert introspect.diff(reference.model, candidate, inputs, noise_budget=True).passed
