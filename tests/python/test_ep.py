# ctest: no-isa-variants (rows only move; the sums are the one-process calls', tested per ISA elsewhere)
"""xte.EPGroup: dispatch / combine and their backwards over the threads transport (Python threads,
one per rank) and over MPI (mpi4py, under mpiexec), byte-equal to the one-process Python calls
(xte.moe_permute / moe_unpermute and their backwards) for 1 to 3 ranks; NumPy and torch in."""

import os
import shutil
import subprocess
import sys
import threading

import numpy as np
import pytest

import xte

HERE = os.path.dirname(os.path.abspath(__file__))


def problem(R, El, K, H, T, seed, dtype=np.float32):
    rng = np.random.default_rng(seed)
    E = El * R
    tok = []
    for r in range(R):
        idx = np.stack([rng.permutation(E)[:K] for _ in range(T[r])]) if T[r] else \
            np.zeros((0, K), np.int64)
        idx = np.where(rng.random(idx.shape) < 0.1, -1, idx).astype(np.int32)
        tok.append(idx)
    topk = np.concatenate(tok) if tok else np.zeros((0, K), np.int32)
    w = rng.random(topk.shape, dtype=np.float32)
    x = rng.standard_normal((topk.shape[0], H)).astype(dtype)
    return topk, w, x


def one_process(topk, w, x, E, align):
    px, rim, ex = xte.moe_permute(x, topk, map_type="index", num_experts=E, align=align,
                                  return_extras=True)
    rng = np.random.default_rng(1)
    y = rng.standard_normal(px.shape).astype(np.float32)
    out = xte.moe_unpermute(y, rim, w)
    gout = rng.standard_normal(out.shape).astype(np.float32)
    gy, gw = xte.moe_unpermute_backward(gout, y, rim, w)
    g = rng.standard_normal(px.shape).astype(np.float32)
    gx = xte.moe_permute_backward(g, rim)
    return dict(px=px, off=ex["expert_offsets"], y=y, out=out, gout=gout, gy=gy, gw=gw, g=g, gx=gx)


def rank_step(g, r, topk, w, x, toff, ref, El):
    lo, hi = int(ref["off"][r * El]), int(ref["off"][(r + 1) * El])
    a, b = toff[r], toff[r + 1]
    h = g.prepare(topk[a:b])
    assert h.recv_rows == hi - lo
    rx, rs, rw = g.dispatch(h, x[a:b], None, w[a:b])
    assert rs is None
    np.testing.assert_array_equal(rx.view(np.uint8), ref["px"][lo:hi].view(np.uint8))
    out, slots = g.combine(h, ref["y"][lo:hi], w[a:b])
    np.testing.assert_array_equal(out.view(np.uint8), ref["out"][a:b].view(np.uint8))
    gy, gw = g.combine_backward(h, ref["gout"][a:b], w[a:b], slots)
    np.testing.assert_array_equal(gy.view(np.uint8), ref["gy"][lo:hi].view(np.uint8))
    np.testing.assert_array_equal(gw.view(np.uint8), ref["gw"][a:b].view(np.uint8))
    gx = g.dispatch_backward(h, ref["g"][lo:hi])
    np.testing.assert_array_equal(gx.view(np.uint8), ref["gx"][a:b].view(np.uint8))
    return rx


def on_every_rank(R, body, timeout=120):
    """Runs body(world, r) on R threads of one ThreadsWorld; fails on a hang or any rank's error."""
    world = xte.ThreadsWorld(R)
    errors = []

    def run(r):
        try:
            body(world, r)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append((r, e))

    ths = [threading.Thread(target=run, args=(r,)) for r in range(R)]
    for t in ths:
        t.start()
    for t in ths:
        t.join(timeout=timeout)
    assert not any(t.is_alive() for t in ths), "a rank hangs"
    assert not errors, errors
    world.close()


@pytest.mark.parametrize("R", [1, 2, 3])
def test_threads_bytes_equal_one_process(R):
    El, K, H, align = 4, 4, 40, 8
    T = [29, 0, 17][:R]
    topk, w, x = problem(R, El, K, H, T, 7 + R)
    toff = np.concatenate([[0], np.cumsum(T)]).astype(int)
    ref = one_process(topk, w, x, El * R, align)

    def body(world, r):
        g = xte.EPGroup.threads(world, r, experts_per_rank=El, hidden=H, topk=K,
                                max_tokens_per_rank=max(T), align=align)
        assert (g.rank, g.num_ranks, g.transport) == (r, R, "threads")
        rank_step(g, r, topk, w, x, toff, ref, El)
        st = g.stats()
        assert st["calls"] == 4
        g.close()

    on_every_rank(R, body)


@pytest.mark.parametrize("R", [1, 3])
def test_threads_dispatch_tokens_then_permute(R):
    """Token-major dispatch: moe_permute of its rows (local experts, the group's align) gives
    dispatch's expert-major rows; combine after it gives the one-process unpermute."""
    El, K, H, align = 4, 4, 40, 8
    T = [29, 0, 17][:R]
    topk, w, x = problem(R, El, K, H, T, 11 + R)
    toff = np.concatenate([[0], np.cumsum(T)]).astype(int)
    ref = one_process(topk, w, x, El * R, align)

    def body(world, r):
        g = xte.EPGroup.threads(world, r, experts_per_rank=El, hidden=H, topk=K,
                                max_tokens_per_rank=max(T), align=align)
        lo, hi = int(ref["off"][r * El]), int(ref["off"][(r + 1) * El])
        a, b = toff[r], toff[r + 1]
        h = g.prepare(topk[a:b])
        rx, rs, ri, rw = g.dispatch_tokens(h, x[a:b], None, w[a:b])
        assert rs is None and rx.shape[0] == h.recv_tokens
        assert ri.dtype == np.int32 and ((ri >= -1) & (ri < El)).all()
        assert (rw[ri < 0] == 0).all()
        px = xte.moe_permute(rx, ri, map_type="index", num_experts=El, align=align)[0]
        assert px.shape[0] == hi - lo
        np.testing.assert_array_equal(px.view(np.uint8), ref["px"][lo:hi].view(np.uint8))
        out, _ = g.combine(h, ref["y"][lo:hi], w[a:b])
        np.testing.assert_array_equal(out.view(np.uint8), ref["out"][a:b].view(np.uint8))
        g.close()

    on_every_rank(R, body)


def test_error_on_one_rank_is_an_error_on_every_rank():
    world = xte.ThreadsWorld(2)
    res = {}

    def run(r):
        g = xte.EPGroup.threads(world, r, experts_per_rank=2, hidden=8, topk=2,
                                max_tokens_per_rank=4)
        idx = np.array([[0, 1], [2, 3]], np.int32)
        if r == 1:
            idx[1, 1] = 9  # out of range
        try:
            g.prepare(idx)
            res[r] = None
        except xte.XteValueError as e:
            res[r] = str(e)
        g.close()

    ths = [threading.Thread(target=run, args=(r,)) for r in range(2)]
    for t in ths:
        t.start()
    for t in ths:
        t.join(timeout=60)
    assert res[1] and "topk_idx[1, 1]" in res[1], res
    assert res[0] and "rank 1" in res[0], res
    world.close()


def test_torch_in_torch_out():
    torch = pytest.importorskip("torch")
    El, K, H = 2, 2, 16
    topk, w, x = problem(1, El, K, H, [9], 3)
    ref = one_process(topk, w, x, El, 1)
    world = xte.ThreadsWorld(1)
    g = xte.EPGroup.threads(world, 0, experts_per_rank=El, hidden=H, topk=K, max_tokens_per_rank=9)
    h = g.prepare(torch.from_numpy(topk))
    rx, _, rw = g.dispatch(h, torch.from_numpy(x), None, torch.from_numpy(w))
    assert isinstance(rx, torch.Tensor) and isinstance(rw, torch.Tensor)
    np.testing.assert_array_equal(rx.numpy().view(np.uint8), ref["px"].view(np.uint8))
    out, _ = g.combine(h, torch.from_numpy(ref["y"]), torch.from_numpy(w))
    np.testing.assert_array_equal(out.numpy().view(np.uint8), ref["out"].view(np.uint8))
    g.close()
    world.close()


def test_mpi4py_ranks():
    if shutil.which("mpiexec") is None:
        pytest.skip("no mpiexec (Open MPI / MPICH not installed)")
    if os.environ.get("XTE_REQUIRE_PYTHON_TESTS") != "1":
        pytest.importorskip("mpi4py")
    import mpi4py  # noqa: F401 - must import under XTE_REQUIRE_PYTHON_TESTS=1
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    for n in (1, 3):
        p = subprocess.run(["mpiexec", "-n", str(n), "--oversubscribe", sys.executable,
                            os.path.join(HERE, "ep_mpi_worker.py")], env=env,
                           capture_output=True, text=True, timeout=240)
        assert p.returncode == 0, p.stdout + p.stderr
        assert p.stdout.count("ok") == n, p.stdout


def test_nccl_argument_errors():
    kw = dict(experts_per_rank=2, hidden=16, topk=2, max_tokens_per_rank=4, device=0)
    for bad in (object(), "0x1000", 1.5, True):
        with pytest.raises(xte.XteDTypeError, match="comm"):
            xte.EPGroup.nccl(bad, **kw)
    for bad in (0, -8, 1 << 64):
        with pytest.raises(xte.XteValueError, match="comm"):
            xte.EPGroup.nccl(bad, **kw)


def test_nccl_without_a_gpu_is_an_error():
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        pytest.skip("a CUDA device is present: a made-up communicator would reach NCCL")
    # no device here: the group's stream cannot be made, so no NCCL call sees the made-up value
    with pytest.raises(xte.XteError) as e:
        xte.EPGroup.nccl(0x1000, experts_per_rank=2, hidden=16, topk=2, max_tokens_per_rank=4,
                         device=0)
    assert e.value.message
