"""A build that calls ``sys.exit(0)`` (must end in exit 2, never 0)."""

import sys


def build(reference):
    sys.exit(0)
