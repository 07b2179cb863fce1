"""One rank of tests/python/test_ep.py's MPI case (run by mpiexec): xte.EPGroup over
MPI.COMM_WORLD, every output byte-equal to the one-process calls; prints "ok" per rank."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

import xte  # noqa: E402
from test_ep import one_process, problem, rank_step  # noqa: E402

comm = MPI.COMM_WORLD
R, r = comm.Get_size(), comm.Get_rank()
El, K, H = 3, 3, 24
T = [11 + 5 * i if i != 1 else 0 for i in range(R)]
topk, w, x = problem(R, El, K, H, T, 5)
toff = np.concatenate([[0], np.cumsum(T)]).astype(int)
ref = one_process(topk, w, x, El * R, 4)
g = xte.EPGroup.mpi(comm, experts_per_rank=El, hidden=H, topk=K, max_tokens_per_rank=max(T),
                    align=4)
assert g.transport == "mpi" and g.num_ranks == R
rank_step(g, r, topk, w, x, toff, ref, El)
g.close()
print("ok", flush=True)
