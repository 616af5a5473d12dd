"""``python -m host_kernel``: the same command line as the ``host-kernel`` script."""

from __future__ import annotations

from ._launch import console

if __name__ == "__main__":
    raise SystemExit(console())
