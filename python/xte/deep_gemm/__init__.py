"""DeepGEMM's Python API over xte: `import xte.deep_gemm as deep_gemm` is the only change a
DeepGEMM user's code needs (docs/python.md, "Coming from DeepGEMM / TransformerEngine")."""
