"""Storage: the ledger (SQLite by default, PostgreSQL by URL) and the blob store.

The lowest layer of the record: it imports nothing of the Host, the verifier,
lineage or the sandbox (docs/architecture.md).
"""
