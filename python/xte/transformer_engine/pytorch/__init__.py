"""transformer_engine.pytorch over xte: the fused MoE router (router.py), the MoE permutation
functions (permutation.py), the FP8 modules (module.py) and the FP8 autocast / quantizers (fp8.py),
under TransformerEngine's names and signatures."""
from .router import *  # noqa: F401,F403
from .permutation import *  # noqa: F401,F403
from .module import *  # noqa: F401,F403
from .fp8 import *  # noqa: F401,F403
