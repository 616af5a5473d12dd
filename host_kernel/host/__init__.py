"""The trusted side: the Host and the parts it is a facade over (see host/_host.py).

Everything here runs in the Host process, never in the kernel. Fronts import
``host_kernel.host._host.Host``; nothing here imports a front.
"""
