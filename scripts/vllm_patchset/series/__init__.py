"""The patch series: patch files and trailers, where code is, per-patch states, text edits."""
