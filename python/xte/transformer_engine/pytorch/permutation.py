"""transformer_engine.pytorch.permutation over xte."""
__all__ = []
