"""The collector during a generation (``generation.collector``): the objects alive when it
starts are set aside for its duration and given back after, whatever happens; a process
that froze objects of its own, or turned the collector off, is left as it is."""

from __future__ import annotations

import gc

import pytest

from introspect.diff.generation.collector import YOUNG_THRESHOLD, older_objects_set_aside


def test_older_objects_are_set_aside_and_given_back():
    assert gc.get_freeze_count() == 0
    thresholds = gc.get_threshold()
    with pytest.raises(RuntimeError), older_objects_set_aside():
        assert gc.get_freeze_count() > 0
        assert gc.get_threshold()[0] >= YOUNG_THRESHOLD
        raise RuntimeError("a step failed")
    assert gc.get_freeze_count() == 0
    assert gc.get_threshold() == thresholds


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
            assert gc.get_freeze_count() == frozen and gc.get_threshold()[0] < YOUNG_THRESHOLD
        assert gc.get_freeze_count() == frozen  # not given back: not ours
    finally:
        gc.unfreeze()
