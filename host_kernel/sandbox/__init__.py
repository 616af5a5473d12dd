"""OS confinement for everything the Host starts: the kernel, ``host.bash`` commands.

- ``landlock``: the Landlock system calls (ctypes).
- ``policy``: which paths a session's confined processes may read and write.
- ``init``: the sandbox's first process (namespaces, ``/proc``, Landlock, spawner).
- ``client``: the Host's side: probe, launch, spawn commands, signal them.

Kept import-free: ``init`` runs on every kernel start and imports only what it needs.
"""
