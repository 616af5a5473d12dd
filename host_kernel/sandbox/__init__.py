"""OS confinement for everything the Host starts: the kernel, ``host.bash`` commands.

- ``landlock``: the Landlock system calls (ctypes).
- ``policy``: which paths a session's confined processes may read and write, and what
  their private view covers and keeps.
- ``init``: the sandbox's first process (namespaces, ``/proc``, Landlock, spawner).
- ``world``: what init builds before anything confined runs (the namespaces, the private
  view, ``lo``, the capabilities dropped, the limits and their watch).
- ``client``: the Host's side: launch, spawn commands, signal them.
- ``confinement``: probe, and what the record says about confinement.
- ``netns``: slirp4netns, the user-mode network of a sandbox with network.
- ``limits``: a generation's bounds, their defaults, the cgroups that hold them.

Kept import-free: ``init`` runs on every kernel start and imports only what it needs.
"""
