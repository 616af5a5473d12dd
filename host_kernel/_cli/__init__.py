"""The parts of the ``host-kernel`` command line behind :mod:`host_kernel.cli`, its door.

* :mod:`.common`: what every command uses (the :class:`~.common.Command`
  record, the two errors and the exit codes, the record and store options,
  the notebook reader); it imports no command and not :mod:`host_kernel.cli`;
* :mod:`.exec`: ``host-kernel exec``;
* :mod:`.readers`: the commands that read a record (``audit``, ``ls``,
  ``show``, ``lineage``, ``receipt``).

The registry, the parser and ``main`` are :mod:`host_kernel.cli`'s; the
commands that live with the part they drive are in that part's ``commands``
module (``agent``, ``batch``, ``control``, ``viewer``).
"""
