"""transformer_engine.common over xte: the FP8 recipes (xte.transformer_engine.common.recipe)."""
from . import recipe  # noqa: F401
