"""transformer_engine.pytorch.fp8 over xte."""
__all__ = []
