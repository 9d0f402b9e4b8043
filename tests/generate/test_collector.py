"""The collector during a generation (``generation.collector``): the objects alive when it
starts are set aside for its duration and given back after, whatever happens; a process
that froze objects of its own, or turned the collector off, is left as it is."""

from __future__ import annotations

import gc

import pytest

from introspect.diff.generation.collector import older_objects_set_aside


def test_older_objects_are_set_aside_and_given_back():
    assert gc.get_freeze_count() == 0
    with pytest.raises(RuntimeError), older_objects_set_aside():
        assert gc.get_freeze_count() > 0
        raise RuntimeError("a step failed")
    assert gc.get_freeze_count() == 0


def test_a_process_of_its_own_mind_is_left_as_it_is():
    gc.disable()
    try:
        with older_objects_set_aside():
            assert gc.get_freeze_count() == 0 and not gc.isenabled()
    finally:
        gc.enable()
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        with older_objects_set_aside():
            assert gc.get_freeze_count() == frozen
        assert gc.get_freeze_count() == frozen  # not given back: not ours
    finally:
        gc.unfreeze()
