"""Ranks as processes: a hub that runs cocemu's runtime for rank processes (hub.py), what a rank
process calls it through (client.py), the frames between them (wire.py), the shared-memory arena
arrays cross in (arena.py), and the objects all ranks of a run share (shared.py).
`python -m cocemu.processes` runs a hub for torchrun (cocemu.torch starts it)."""
