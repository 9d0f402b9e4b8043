"""``introspect.diff.repro.program``: what the repro writes as source is made by Python's
own quoting of plain values, never by an object's ``__repr__``, ``__str__`` or name
(issue 42); a value or a name it cannot write safely is a ``ReproError``."""

from __future__ import annotations

import ast
import math

import pytest
import torch

from introspect.diff.repro.program import ReproError, function_name, literal, write_program

CODE = "'); open('PWNED', 'w'); print(end='"


class EvilStr(str):
    def __repr__(self):
        return CODE

    __str__ = __repr__


class EvilInt(int):
    def __repr__(self):
        return CODE


class EvilFloat(float):
    def __repr__(self):
        return CODE


def _tensor(value: object) -> str:
    raise AssertionError("no tensor here")


@pytest.mark.parametrize("value, source", [
    (EvilStr("tanh"), "'tanh'"),
    (EvilStr('a"""\\N\n'), repr('a"""\\N\n')),
    (EvilInt(3), "3"),
    (EvilFloat(0.5), "0.5"),
    (math.nan, "float('nan')"),
    (math.inf, "float('inf')"),
    (-math.inf, "-float('inf')"),
    ([EvilStr("x"), (EvilInt(1),)], "['x', (1,)]"),
    ({EvilStr("k"): EvilStr("v")}, "{'k': 'v'}"),
    (torch.float16, "torch.float16"),
    (torch.device("cpu"), "torch.device('cpu', None)"),
])
def test_a_literal_is_python_own_quoting_of_the_plain_value(value, source):
    written = literal(value, _tensor)
    assert written == source and "PWNED" not in written
    ast.parse(written, mode="eval")  # one expression, whatever the value held


def test_an_object_no_literal_writes_is_refused_without_its_repr():
    class Opaque:
        def __repr__(self):
            return CODE

    with pytest.raises(ReproError) as caught:
        literal(Opaque(), _tensor)
    assert "PWNED" not in str(caught.value)


def test_a_function_torch_does_not_name_is_refused():
    def f(x):
        return x

    f.__name__ = f.__qualname__ = 'gelu"); open("PWNED", "w"); ("'
    with pytest.raises(ReproError):
        function_name(f)
    assert function_name(torch.nn.functional.gelu) == "torch.nn.functional.gelu"
    assert function_name(torch.ops.aten.add.Tensor) == "torch.ops.aten.add.Tensor"


def test_a_keyword_that_is_no_name_is_refused():
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    node = graph.call_function(torch.nn.functional.gelu, (x,))

    class Named(torch.nn.Module):
        pass

    gm = torch.fx.GraphModule(Named(), graph)
    gelu = torch.nn.functional.gelu

    def odd(t):
        return gelu(t, **{'approximate="tanh"); open("PWNED", "w"); ("': "none"})

    node.target = odd
    with pytest.raises((ReproError, TypeError)):
        write_program(node, gm, (torch.ones(2),), {}, [node], "reference")
