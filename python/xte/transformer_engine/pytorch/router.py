"""transformer_engine.pytorch.router over xte."""
__all__ = []
