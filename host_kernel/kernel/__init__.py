"""The untrusted side: what runs inside the kernel (the ``host`` client, the IPython
extension, the audit-hook capture, the standby launcher).

Nothing here decides acceptance, and nothing here imports the Host (host/).
"""
