"""transformer_engine.pytorch.custom_recipes over xte: MMParams (gemm.py) and a plain-torch
per-tensor current-scaling reference quantizer (reference_current_scaling.py). xte's modules do
not run custom recipes (CustomRecipe raises NotImplementedError in autocast)."""
