"""The engine end-to-end check (`python benchmarks/engine_e2e.py`): cli.py says what it
measures, each module owns one step of it."""
