"""The attention graph module introspect generates holds our names only (issue 42): a
model's module named with quotes or a backslash gives the same maps as a plainly named
one, not a SyntaxError in code introspect wrote, nor code of the name's choosing.

The port is a file of its own (written into tmp_path), importing nothing from introspect.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

import introspect

MY_PORT = Path(__file__).resolve().parents[2] / "examples" / "ci" / "my_port.py"

NAMES = ['act\\N', 'q"x\'\\U0001', 'a"), open("PWNED", "w"), getattr(self, "b',
         'x"""\nopen("PWNED", "w")\n"""']

PORT = '''"""my_port with layer 0's activation under a module name of the caller's choosing."""
import importlib.util

from torch import nn

_spec = importlib.util.spec_from_file_location("my_port_named", {my_port!r})
my_port = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(my_port)


class Wrap(nn.Module):
    def __init__(self, name):
        super().__init__()
        self.name = name
        self.add_module(name, nn.GELU())

    def forward(self, x):
        return getattr(self, self.name)(x)


def build(reference, name):
    model = my_port.build(reference)
    model.blocks[0].act = Wrap(name)  # before the last attention: part of the graph module
    return model.eval()
'''


@pytest.fixture(scope="module")
def port(tmp_path_factory):
    path = tmp_path_factory.mktemp("port") / "named_port.py"
    path.write_text(PORT.format(my_port=str(MY_PORT)))
    spec = importlib.util.spec_from_file_location("named_port", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def plain_maps(port, tiny_models):
    loaded = tiny_models("base", "sdpa")
    return introspect.attention(port.build(loaded, "act"), introspect.tokenize(loaded.tokenizer))


@pytest.mark.parametrize("name", NAMES)
def test_a_module_name_is_no_code_in_the_graph_module(name, port, plain_maps, tiny_models,
                                                       tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    loaded = tiny_models("base", "sdpa")
    maps = introspect.attention(port.build(loaded, name), introspect.tokenize(loaded.tokenizer))
    assert not (tmp_path / "PWNED").exists()
    assert torch.equal(maps.probs, plain_maps.probs)
