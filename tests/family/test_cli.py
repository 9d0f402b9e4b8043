"""The cousins through the real CLI: diff against HF, and the from-scratch BERT refused."""

from __future__ import annotations

import subprocess
import sys

from tests import launch


def _introspect(*args: str) -> subprocess.CompletedProcess[str]:
    return launch.run([sys.executable, "-m", "introspect", *args], capture_output=True,
                      text=True)


def test_a_decoder_diffs_sdpa_against_eager_through_the_cli():
    done = _introspect("diff", "--model", "llama-tiny", "--head", "causal-lm",
                       "--candidate", "hf", "--candidate-attn", "eager", "-q")
    assert done.returncode == 0, done.stderr
    said = " ".join(done.stdout.split())  # (wrapped to the terminal's width where it has one)
    assert said.startswith("hf LlamaForCausalLM (llama-tiny, eager) vs hf "
                           "LlamaForCausalLM (llama-tiny, sdpa): parity holds")


def test_the_from_scratch_bert_is_no_candidate_for_a_cousin():
    done = _introspect("diff", "--model", "llama-tiny", "--head", "causal-lm", "-q")
    assert done.returncode == 2 and done.stdout == "" and done.stderr.count("\n") == 1
    assert "the from-scratch model is a BERT; llama-tiny is a llama (LlamaForCausalLM)" \
        in done.stderr


def test_the_refusal_comes_before_the_cousin_is_built(monkeypatch, capsys):
    import introspect.models.load
    from introspect.cli.main import main

    def never(*args, **kwargs):
        raise AssertionError("the cousin was loaded before the refusal")

    monkeypatch.setattr(introspect.models.load, "load_model", never)  # 125M parameters to draw
    assert main(["diff", "--model", "roberta-base", "-q"]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "the from-scratch model is a BERT; roberta-base is a " \
        "roberta (RobertaModel)" in error
