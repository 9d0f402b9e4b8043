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


def test_a_process_of_its_own_mind_is_left_as_it_is(monkeypatch):
    calls: list[str] = []
    monkeypatch.setattr(gc, "freeze", lambda: calls.append("freeze"))
    monkeypatch.setattr(gc, "unfreeze", lambda: calls.append("unfreeze"))
    thresholds = gc.get_threshold()
    gc.disable()
    try:
        with older_objects_set_aside():
            assert not gc.isenabled() and gc.get_threshold() == thresholds
    finally:
        gc.enable()
    # A process that froze objects itself (counted as frozen here: the count itself moves
    # as frozen objects die by their reference counts, so it is no proof)
    monkeypatch.setattr(gc, "get_freeze_count", lambda: 12345)
    with older_objects_set_aside():
        assert gc.get_threshold() == thresholds
    assert calls == []  # neither frozen nor given back: not ours
