"""TransformerEngine's Python API over xte: `import xte.transformer_engine as transformer_engine`
(or `import xte.transformer_engine.pytorch as te`) is the only change a TransformerEngine user's
code needs (docs/python.md, "Coming from DeepGEMM / TransformerEngine")."""
from . import common, pytorch  # noqa: F401
