"""Expert parallelism (include/xte/ep.h): dispatch and combine over MPI (an mpi4py communicator),
NCCL (a torch.distributed NCCL process group, CUDA tensors) or the threads-in-one-process
transport (tests). See docs/ep.md.

    g = xte.EPGroup.mpi(MPI.COMM_WORLD, experts_per_rank=96, hidden=7168, topk=8, align=128,
                        max_tokens_per_rank=4096)
    h = g.prepare(topk_idx)                           # collective; h serves forward and backward
    recv_x, recv_scales, recv_w = g.dispatch(h, x, x_scales, topk_weights)
    ...                                               # the local experts on recv_x
    out, slot_rows = g.combine(h, expert_out, topk_weights)
    grad_expert_out, grad_w = g.combine_backward(h, grad_out, topk_weights, slot_rows)
    grad_x = g.dispatch_backward(h, grad_recv_x)

Every call but close() is collective (every rank of the group, in the same order). Results are
the one-process token movement's bytes (xte_moe_permute / unpermute and their backwards) for any
number of ranks. Outputs are allocated in x's framework (torch or NumPy), on x's device.
"""

import ctypes
from typing import Any, Dict, Optional, Tuple

from .. import _lib
from .._lib import DType, EpCounts, EpStats, Status, call, lib
from .._tensor import cuda_stream, empty, loaded_torch, stream_of, view, view_opt, zeros
from .._typing import Array, DTypeLike
from ._common import parse_dtype

_ROWS = (DType.FP32, DType.BF16)
_X = (DType.FP32, DType.BF16, DType.E4M3, DType.E5M2)


def _ptr(v):
    return None if v is None else v.ptr


class ThreadsWorld:
    """A world of `num_ranks` ranks for the threads transport: each rank is a Python thread
    calling EPGroup.threads(world, rank, ...) (ctypes releases the GIL during the calls)."""

    def __init__(self, num_ranks):
        w = ctypes.c_void_p()
        call("xte_ep_threads_world_create", int(num_ranks), ctypes.byref(w))
        self._w = w
        self.num_ranks = int(num_ranks)

    def close(self) -> None:
        if self._w:
            lib.xte_ep_threads_world_destroy(self._w)
            self._w = None

    def __del__(self):
        self.close()


class EPHandle:
    """A prepared step: the routing handle (memory owned here) and its counts."""

    def __init__(self, group, buf, counts, tokens_per_expert, num_tokens):
        self.group = group
        self._buf = buf
        self.recv_rows = counts.recv_rows
        self.slot_rows = counts.slot_rows
        self.recv_tokens = counts.recv_tokens
        self.tokens_per_expert = tokens_per_expert
        self.num_tokens = num_tokens

    @property
    def ptr(self):
        return ctypes.c_void_p(self._buf.ctypes.data)


class EPGroup:
    """An expert-parallel group (xte_ep_group). Build it with EPGroup.mpi, EPGroup.nccl or
    EPGroup.threads."""

    def __init__(self, handle, cfg, world=None):
        self._g = handle
        self._world = world  # keeps a threads world alive
        self.experts_per_rank = cfg.experts_per_rank
        self.hidden = cfg.hidden
        self.topk = cfg.topk
        self.align = cfg.align
        self.max_tokens_per_rank = cfg.max_tokens_per_rank
        r, n, t = ctypes.c_int(), ctypes.c_int(), ctypes.c_char_p()
        call("xte_ep_group_info", self._g, ctypes.byref(r), ctypes.byref(n), ctypes.byref(t))
        self.rank, self.num_ranks, self.transport = r.value, n.value, t.value.decode()

    @staticmethod
    def _config(experts_per_rank, hidden, topk, align, max_tokens_per_rank):
        cfg = lib.xte_ep_config_default()
        cfg.experts_per_rank = int(experts_per_rank)
        cfg.hidden = int(hidden)
        cfg.topk = int(topk)
        cfg.align = int(align)
        cfg.max_tokens_per_rank = int(max_tokens_per_rank)
        return cfg

    @classmethod
    def mpi(cls, comm: Any, *, experts_per_rank: int, hidden: int, topk: int,
            max_tokens_per_rank: int, align: int = 1) -> "EPGroup":
        """A group over an mpi4py communicator (collective). xte duplicates it."""
        try:
            from mpi4py import MPI
        except ImportError as e:  # pragma: no cover - depends on the environment
            raise _lib.XteUnsupportedError(Status.UNSUPPORTED,
                                           f"comm: mpi4py is not installed ({e})") from None
        if not isinstance(comm, MPI.Comm):
            raise _lib.XteDTypeError(Status.DTYPE, f"comm: {type(comm).__name__} is not an "
                                     "mpi4py communicator")
        cfg = cls._config(experts_per_rank, hidden, topk, align, max_tokens_per_rank)
        g = ctypes.c_void_p()
        call("xte_ep_group_create_mpi", ctypes.c_void_p(MPI._addressof(comm)), ctypes.byref(cfg),
             ctypes.byref(g))
        return cls(g, cfg)

    @classmethod
    def nccl(cls, comm: Any, *, experts_per_rank: int, hidden: int, topk: int,
             max_tokens_per_rank: int, align: int = 1, device=None) -> "EPGroup":
        """A group over NCCL on a CUDA device (collective; the CUDA plugin loads libnccl.so.2 with
        dlopen). comm: a torch.distributed process group with the NCCL backend (its communicator,
        ``pg._get_backend(torch.device("cuda"))._comm_ptr()``: create the group with
        ``device_id=`` or run one collective first, as ProcessGroupNCCL makes its communicator
        lazily), or an int, an ncclComm_t's value. Borrowed: the communicator must outlive the
        group, and must come from the NCCL library xte loads (in a torch process, torch's own
        libnccl.so.2, found by its soname). device: the communicator's CUDA device (default
        torch's current device, else 0). Tensors passed to the group are CUDA tensors of that
        device; calls run on torch's current stream."""
        torch = loaded_torch()
        if device is None:
            device = torch.cuda.current_device() if torch is not None and \
                torch.cuda.is_available() else 0
        if isinstance(comm, bool) or not isinstance(comm, int):
            get = None
            if torch is not None and hasattr(comm, "_get_backend"):
                try:
                    get = getattr(comm._get_backend(torch.device("cuda", int(device))),
                                  "_comm_ptr", None)
                except (RuntimeError, ValueError) as e:
                    raise _lib.XteUnsupportedError(
                        Status.UNSUPPORTED, f"comm: the process group has no NCCL backend "
                        f"({e})") from None
                if get is None:
                    raise _lib.XteUnsupportedError(
                        Status.UNSUPPORTED, "comm: this torch's NCCL process group does not "
                        "expose its communicator (_comm_ptr)")
            else:
                raise _lib.XteDTypeError(Status.DTYPE, f"comm: {type(comm).__name__} is neither "
                                         "a torch.distributed process group nor an int")
            comm = int(get())
        if comm <= 0 or comm >= 1 << 64:
            raise _lib.XteValueError(Status.INVALID_ARGUMENT, f"comm: {comm:#x} is not an "
                                     "ncclComm_t (a null communicator: has the process group "
                                     "made it yet?)")
        cfg = cls._config(experts_per_rank, hidden, topk, align, max_tokens_per_rank)
        c = ctypes.c_void_p(comm)
        g = ctypes.c_void_p()
        call("xte_ep_group_create_nccl", ctypes.byref(c), ctypes.byref(cfg),
             cuda_stream(int(device)), ctypes.byref(g))
        return cls(g, cfg)

    @classmethod
    def threads(cls, world: ThreadsWorld, rank: int, *, experts_per_rank: int, hidden: int,
                topk: int, max_tokens_per_rank: int, align: int = 1) -> "EPGroup":
        """Rank `rank` of a ThreadsWorld (collective over the world's threads)."""
        cfg = cls._config(experts_per_rank, hidden, topk, align, max_tokens_per_rank)
        g = ctypes.c_void_p()
        call("xte_ep_group_create_threads", world._w, int(rank), ctypes.byref(cfg),
             ctypes.byref(g))
        return cls(g, cfg, world)

    def close(self) -> None:
        if self._g:
            lib.xte_ep_group_destroy(self._g)
            self._g = None

    def __del__(self):
        self.close()

    def stats(self, reset: bool = False) -> Dict[str, Any]:
        """xte_ep_group_stats as a dict (seconds and bytes)."""
        s = EpStats()
        s.struct_size = ctypes.sizeof(EpStats)
        call("xte_ep_group_stats", self._g, ctypes.byref(s), 1 if reset else 0)
        return {"calls": s.calls, "pack_s": s.pack_ns * 1e-9, "exchange_s": s.exchange_ns * 1e-9,
                "local_s": s.local_ns * 1e-9, "bytes_sent": s.bytes_sent,
                "bytes_received": s.bytes_received}

    # ------------------------------------------------------------------ the step

    def prepare(self, topk_idx: Array) -> EPHandle:
        """topk_idx int32 / int64 [T, topk] (-1: none) -> an EPHandle (collective)."""
        import numpy as np
        vi = view(topk_idx, "topk_idx", (DType.INT32, DType.INT64))
        size = ctypes.c_size_t()
        call("xte_ep_handle_size", self._g, ctypes.byref(size))
        buf = np.empty(max(1, (size.value + 7) // 8), dtype=np.int64)
        tpe = empty(vi, (self.experts_per_rank,), DType.INT64)
        vt = view(tpe, "tokens_per_expert", writable=True)
        counts = EpCounts()
        call("xte_ep_prepare", self._g, vi.ptr, ctypes.c_void_p(buf.ctypes.data),
             ctypes.c_size_t(buf.nbytes), ctypes.byref(counts), vt.ptr, stream_of(vi))
        return EPHandle(self, buf, counts, tpe, vi.shape[0] if vi.shape else 0)

    def dispatch(self, handle: EPHandle, x: Array, x_scales: Optional[Array] = None,
                 topk_weights: Optional[Array] = None
                 ) -> Tuple[Array, Optional[Array], Optional[Array]]:
        """x [T, hidden] fp32 / bf16 / e4m3 / e5m2 (fp8 with x_scales [T, S] fp32 / e8m0) ->
        (recv_x [recv_rows, hidden], recv_scales or None, recv_weights [recv_rows] or None)."""
        vx = view(x, "x", _X)
        vs = view_opt(x_scales, "x_scales", (DType.FP32, DType.E8M0))
        vw = view_opt(topk_weights, "topk_weights", (DType.FP32,))
        rx = empty(vx, (handle.recv_rows, self.hidden), vx.dtype)
        vrx = view(rx, "recv_x", writable=True)
        rs = vrs = rw = vrw = None
        if vs is not None:
            cols = vs.shape[-1] if vs.shape else 0
            rs = empty(vx, (handle.recv_rows, cols), vs.dtype)
            vrs = view(rs, "recv_scales", writable=True)
        if vw is not None:
            rw = empty(vx, (handle.recv_rows,), DType.FP32)
            vrw = view(rw, "recv_weights", writable=True)
        call("xte_ep_dispatch", self._g, handle.ptr, vx.ptr, _ptr(vs), _ptr(vw), vrx.ptr,
             _ptr(vrs), _ptr(vrw), stream_of(vx, vs, vw))
        return rx, rs, rw

    def dispatch_tokens(self, handle: EPHandle, x: Array, x_scales: Optional[Array] = None,
                        topk_weights: Optional[Array] = None
                        ) -> Tuple[Array, Optional[Array], Array, Optional[Array]]:
        """Token-major dispatch (DeepEP's normal-mode layout): x [T, hidden] (as dispatch) ->
        (recv_x [recv_tokens, hidden], recv_scales or None, recv_topk_idx int32 [recv_tokens,
        topk]: the local expert of each slot, -1 where it lives on another rank, recv_topk_weights
        fp32 [recv_tokens, topk] or None). moe_permute of these rows gives dispatch's recv_x; it
        counts as the step's dispatch (combine and the backwards follow it)."""
        vx = view(x, "x", _X)
        vs = view_opt(x_scales, "x_scales", (DType.FP32, DType.E8M0))
        vw = view_opt(topk_weights, "topk_weights", (DType.FP32,))
        n = handle.recv_tokens
        rx = empty(vx, (n, self.hidden), vx.dtype)
        vrx = view(rx, "recv_x", writable=True)
        ri = empty(vx, (n, self.topk), DType.INT32)
        vri = view(ri, "recv_topk_idx", writable=True)
        rs = vrs = rw = vrw = None
        if vs is not None:
            cols = vs.shape[-1] if vs.shape else 0
            rs = empty(vx, (n, cols), vs.dtype)
            vrs = view(rs, "recv_scales", writable=True)
        if vw is not None:
            rw = empty(vx, (n, self.topk), DType.FP32)
            vrw = view(rw, "recv_topk_weights", writable=True)
        call("xte_ep_dispatch_tokens", self._g, handle.ptr, vx.ptr, _ptr(vs), _ptr(vw), vrx.ptr,
             _ptr(vrs), vri.ptr, _ptr(vrw), stream_of(vx, vs, vw))
        return rx, rs, ri, rw

    def combine(self, handle: EPHandle, expert_out: Array, topk_weights: Optional[Array] = None,
                out_dtype: Optional[DTypeLike] = None) -> Tuple[Array, Array]:
        """expert_out [>= recv_rows, hidden] fp32 / bf16 -> (out [T, hidden], slot_rows): out
        weighted and summed in xte_moe_unpermute's order; slot_rows (the rows that came back)
        feed combine_backward's grad_weights."""
        ve = view(expert_out, "expert_out", _ROWS)
        vw = view_opt(topk_weights, "topk_weights", (DType.FP32,))
        od = parse_dtype(out_dtype, "out_dtype", _ROWS, ve.dtype)
        out = empty(ve, (handle.num_tokens, self.hidden), od)
        vo = view(out, "out", _ROWS, writable=True)
        slots = empty(ve, (handle.slot_rows, self.hidden), ve.dtype)
        vsl = view(slots, "slot_rows", writable=True)
        call("xte_ep_combine", self._g, handle.ptr, ve.ptr, _ptr(vw), vo.ptr, vsl.ptr,
             stream_of(ve, vw))
        return out, slots

    def combine_backward(self, handle: EPHandle, grad_out: Array,
                         topk_weights: Optional[Array] = None, slot_rows: Optional[Array] = None,
                         grad_dtype: Optional[DTypeLike] = None) -> Tuple[Array, Optional[Array]]:
        """grad_out [T, hidden] -> (grad_expert_out [recv_rows, hidden], grad_weights [T, topk]
        or None: given when topk_weights and slot_rows are)."""
        vg = view(grad_out, "grad_out", _ROWS)
        vw = view_opt(topk_weights, "topk_weights", (DType.FP32,))
        vsl = view_opt(slot_rows, "slot_rows", _ROWS)
        gd = parse_dtype(grad_dtype, "grad_dtype", _ROWS, vg.dtype)
        ge = empty(vg, (handle.recv_rows, self.hidden), gd)
        vge = view(ge, "grad_expert_out", writable=True)
        gw = vgw = None
        if vw is not None and vsl is not None:
            gw = zeros(vg, (handle.num_tokens, self.topk), DType.FP32)
            vgw = view(gw, "grad_weights", writable=True)
        call("xte_ep_combine_backward", self._g, handle.ptr, vg.ptr, _ptr(vw), _ptr(vsl),
             vge.ptr, _ptr(vgw), stream_of(vg, vw, vsl))
        return ge, gw

    def dispatch_backward(self, handle: EPHandle, grad_recv: Array,
                          grad_dtype: Optional[DTypeLike] = None) -> Array:
        """grad_recv [>= recv_rows, hidden] fp32 / bf16 -> grad_x [T, hidden]."""
        vg = view(grad_recv, "grad_recv", _ROWS)
        gd = parse_dtype(grad_dtype, "grad_dtype", _ROWS, vg.dtype)
        gx = empty(vg, (handle.num_tokens, self.hidden), gd)
        vgx = view(gx, "grad_x", writable=True)
        call("xte_ep_dispatch_backward", self._g, handle.ptr, vg.ptr, vgx.ptr, stream_of(vg))
        return gx


__all__ = ["EPGroup", "EPHandle", "ThreadsWorld"]
