"""kdplug's engine: the pipeline stages, the training loop, the teacher cache, checkpoints.

Private to kdplug: plugins use the public API (``kdplug.api``), never this package, and
import-linter holds them to it (pyproject.toml).
"""
