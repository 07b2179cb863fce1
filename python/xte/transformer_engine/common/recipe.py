"""transformer_engine.common.recipe over xte: the recipe classes are xte.recipe's (TE's names,
fields, defaults and class queries; see that module)."""
from ...recipe import (CustomRecipe, DelayedScaling, Float8BlockScaling,  # noqa: F401
                       Float8CurrentScaling, Format, MMParams, MXFP8BlockScaling,
                       NVFP4BlockScaling, QParams, Recipe)

__all__ = ["Format", "MMParams", "QParams", "Recipe", "DelayedScaling", "Float8CurrentScaling",
           "Float8BlockScaling", "MXFP8BlockScaling", "NVFP4BlockScaling", "CustomRecipe"]
