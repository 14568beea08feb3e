"""Upstream trees (the mirror), the walk of the series over a tree, the lock, the overlay build."""
