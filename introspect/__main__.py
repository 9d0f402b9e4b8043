"""``python -m introspect``: the same as the ``introspect`` command."""

from introspect.cli.main import main

raise SystemExit(main())
