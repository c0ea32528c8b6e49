"""``python -m rlx <command>``: the same as the ``rlx`` command (:mod:`rlx.cli`)."""

from __future__ import annotations

from rlx.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
