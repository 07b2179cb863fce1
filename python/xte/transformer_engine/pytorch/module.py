"""transformer_engine.pytorch.module over xte."""
__all__ = []
