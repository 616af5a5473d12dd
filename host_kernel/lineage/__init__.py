"""Lineage: which inputs flowed into each artifact, from what the Host saw.

The analysis of cells (def-use, statements, effects, path patterns), the flow
tracker that carries reads across cells, the graph read back from the record
and its exports. It reads the record through store/; it never imports the Host.
"""
