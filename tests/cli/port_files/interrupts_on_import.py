"""A port that raises KeyboardInterrupt as it is imported."""

raise KeyboardInterrupt


def build(reference):
    raise AssertionError("never reached")
