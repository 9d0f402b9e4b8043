"""Print the shell code that completes introspect's commands and options (bash, zsh, fish).

Examples:
  eval "$(introspect completion bash)"                 # this bash session
  introspect completion bash >> ~/.bashrc              # every bash session
  introspect completion zsh > ~/.zfunc/_introspect     # zsh, with ~/.zfunc on fpath
  introspect completion fish > ~/.config/fish/completions/introspect.fish

The code is argcomplete's: on Tab the shell runs introspect, which answers from its own
argument parser (commands, options, their choices, file names) without importing torch.
"""

from __future__ import annotations

import argparse
import sys

SHELLS = ("bash", "zsh", "fish")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("shell", choices=SHELLS, help="the shell to complete in")


def run(args: argparse.Namespace) -> int:
    from introspect.errors import InputError

    try:
        import argcomplete
    except ImportError as e:  # a dependency: missing only in a broken install
        raise InputError("shell completion needs the package argcomplete: "
                         "python -m pip install argcomplete") from e
    sys.stdout.write(argcomplete.shellcode(["introspect"], shell=args.shell))
    return 0


def complete(parser: argparse.ArgumentParser) -> None:
    """Answer a completion request and exit, when the shell code above made one."""
    import argcomplete

    argcomplete.autocomplete(parser)
