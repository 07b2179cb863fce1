"""Tensors in and out of xte.check: host copies and files.

Every tensor a check reads is turned into a NumPy array once, here: torch tensors on a GPU are
copied to the host explicitly (one .cpu() per tensor, recorded in the report's notes), bf16 /
fp8 / e8m0 keep their bytes as ml_dtypes types. Files: safetensors (the `safetensors` package),
.npy, .npz, and torch.save files (.pt / .pth / .bin: a tensor or a dict of tensors).

NumPy's own formats cannot name ml_dtypes types (np.save writes bf16 / fp8 as raw 'V1' / 'V2'
records). save() therefore stores such arrays as uint8 / uint16 bytes and, in an .npz, writes
their dtype names into the entry '__xte_dtypes__' (a JSON object) that load() reads back; for a
bare .npy, or a file written elsewhere, pass dtypes={'name': 'bfloat16'} (CLI: --dtype).
"""

import json
import os

import numpy as np

__all__ = ["to_host", "load", "save", "as_dtype"]

_ML = ("bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e8m0fnu")
_ALIASES = {"bf16": "bfloat16", "e4m3": "float8_e4m3fn", "e4m3fn": "float8_e4m3fn",
            "e5m2": "float8_e5m2", "e8m0": "float8_e8m0fnu", "ue8m0": "float8_e8m0fnu",
            "fp32": "float32", "float": "float32", "fp16": "float16", "half": "float16"}
_DTYPES_KEY = "__xte_dtypes__"


def _np_dtype(name):
    import ml_dtypes
    n = _ALIASES.get(str(name).lower(), str(name).lower())
    if n in _ML:
        return np.dtype(getattr(ml_dtypes, n))
    return np.dtype(n)


def as_dtype(a, name):
    """a reinterpreted (same bytes) or read as dtype `name`: raw 'V' records, uint8 / uint16 of
    the same item size are viewed; other dtypes must already be `name`."""
    dt = _np_dtype(name)
    a = np.asarray(a)
    if a.dtype == dt:
        return a
    if a.dtype.itemsize == dt.itemsize and (a.dtype.kind in "Vu" or a.dtype.name in _ML):
        return np.ascontiguousarray(a).view(dt)
    raise TypeError(f"cannot read a {a.dtype} array as {dt.name}")


def _is_torch(x):
    import sys
    t = sys.modules.get("torch")
    return t is not None and isinstance(x, t.Tensor)


def to_host(x, name="tensor", notes=None):
    """x as a NumPy array on the host. A torch tensor on a device is copied to the host once
    (and a note says so); None stays None; lists / scalars go through np.asarray."""
    if x is None:
        return None
    if _is_torch(x):
        from ..testing import to_numpy
        if x.device.type != "cpu" and notes is not None:
            notes.append(f"{name}: copied from {x.device} to the host")
        return to_numpy(x.detach().to("cpu"))
    if isinstance(x, np.ndarray):
        return x
    return np.asarray(x)


def _ext(path):
    p = str(path).lower()
    for e in (".safetensors", ".npz", ".npy", ".pt", ".pth", ".bin", ".ckpt"):
        if p.endswith(e):
            return e
    raise ValueError(f"{path}: unknown file type (want .safetensors, .npy, .npz, .pt / .pth / "
                     ".bin from torch.save)")


def load(path, dtypes=None, *, _reader=None):
    """{name: NumPy array} of a file. A .npy holds one array, named after the file's stem; a
    torch.save file a tensor (named likewise), a dict of tensors, or a list / tuple of them
    (named '0', '1', ...). dtypes: {name: dtype name} to read raw bytes as bf16 / fp8 / e8m0."""
    e = _ext(path)
    stem = os.path.splitext(os.path.basename(str(path)))[0]
    out = {}
    if e == ".safetensors":
        out = _load_safetensors(path, _reader)
    elif e == ".npy":
        out = {stem: np.load(path, allow_pickle=False)}
    elif e == ".npz":
        with np.load(path, allow_pickle=False) as z:
            out = {k: z[k] for k in z.files}
        meta = out.pop(_DTYPES_KEY, None)
        if meta is not None:
            for k, v in json.loads(str(meta)).items():
                if k in out:
                    out[k] = as_dtype(out[k], v)
    else:
        out = _load_torch(path, stem)
    for k, v in (dtypes or {}).items():
        if k in out:
            out[k] = as_dtype(out[k], v)
    return out


def _load_safetensors(path, reader=None):
    """The safetensors package's NumPy loader; for dtypes NumPy cannot name (bf16, fp8, e8m0)
    its torch loader when torch is already imported, else the format read directly (an 8-byte
    header length, a JSON header, raw little-endian bytes), which avoids importing torch.
    reader: 'numpy', 'torch' or 'raw' to force one (tests)."""
    import sys
    if reader in (None, "numpy"):
        try:
            from safetensors.numpy import load_file
            return dict(load_file(str(path)))
        except ImportError:
            if reader == "numpy":
                raise
        except (TypeError, ValueError, AttributeError, KeyError):  # a dtype NumPy cannot name
            if reader == "numpy":
                raise
    if reader == "torch" or (reader is None and "torch" in sys.modules):
        try:
            from safetensors.torch import load_file
            return {k: to_host(v) for k, v in load_file(str(path), device="cpu").items()}
        except ImportError:
            if reader == "torch":
                raise
    return _safetensors_raw(path)


def _safetensors_raw(path):
    """The safetensors format read with NumPy only (an 8-byte little-endian header length, a
    JSON header, then the raw bytes), for machines without torch."""
    names = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
             "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2", "F8_E8M0": "float8_e8m0fnu",
             "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8",
             "U16": "uint16", "U32": "uint32", "U64": "uint64", "BOOL": "bool"}
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
        body = f.read()
    out = {}
    for k, meta in header.items():
        if k == "__metadata__":
            continue
        dt = _np_dtype(names[meta["dtype"]])
        a, b = meta["data_offsets"]
        out[k] = np.frombuffer(body[a:b], dtype=dt).reshape(meta["shape"]).copy()
    return out


def _load_torch(path, stem):
    import torch
    obj = torch.load(str(path), map_location="cpu", weights_only=True)
    if _is_torch(obj):
        return {stem: to_host(obj)}
    if isinstance(obj, dict):
        return {str(k): to_host(v) for k, v in obj.items() if _is_torch(v) or
                isinstance(v, np.ndarray)}
    if isinstance(obj, (list, tuple)):
        return {str(i): to_host(v) for i, v in enumerate(obj)}
    raise ValueError(f"{path}: torch.load gave a {type(obj).__name__}, expected a tensor or "
                     "a dict / list of tensors")


def save(path, tensors):
    """Write {name: array or tensor} to a file of the type its name says (one array for .npy).
    bf16 / fp8 / e8m0 keep their bytes and dtype through every format (see the module text)."""
    e = _ext(path)
    host = {k: to_host(v) for k, v in tensors.items()}
    if e == ".safetensors":
        try:
            from safetensors.torch import save_file
        except ImportError:  # no torch (or no safetensors): the format written directly
            save_file = None
        if save_file is not None:
            save_file({k: _to_torch(v) for k, v in host.items()}, str(path))
        else:
            _save_safetensors_raw(path, host)
    elif e == ".npy":
        if len(host) != 1:
            raise ValueError(f"{path}: a .npy file holds one array, not {len(host)}")
        (a,) = host.values()
        np.save(path, _raw(a), allow_pickle=False)
    elif e == ".npz":
        meta = {k: a.dtype.name for k, a in host.items() if a.dtype.name in _ML}
        arrays = {k: _raw(a) for k, a in host.items()}
        if meta:
            arrays[_DTYPES_KEY] = np.array(json.dumps(meta))
        np.savez(path, **arrays)
    else:
        import torch
        torch.save({k: _to_torch(v) for k, v in host.items()}, str(path))


def _raw(a):
    a = np.ascontiguousarray(a)
    if a.dtype.name in _ML:
        return a.view(np.uint16 if a.dtype.itemsize == 2 else np.uint8)
    return a


def _to_torch(a):
    import torch
    a = np.ascontiguousarray(a)
    if a.dtype.name in _ML:
        t = torch.from_numpy(_raw(a).copy())
        return t.view(getattr(torch, a.dtype.name))
    return torch.from_numpy(a.copy())


def _save_safetensors_raw(path, host):
    names = {"float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16",
             "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2", "float8_e8m0fnu": "F8_E8M0",
             "int64": "I64", "int32": "I32", "int16": "I16", "int8": "I8", "uint8": "U8",
             "bool": "BOOL"}
    header, chunks, off = {}, [], 0
    for k, a in host.items():
        b = np.ascontiguousarray(a).tobytes()
        header[k] = {"dtype": names[a.dtype.name], "shape": list(a.shape),
                     "data_offsets": [off, off + len(b)]}
        chunks.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(len(h).to_bytes(8, "little"))
        f.write(h)
        for c in chunks:
            f.write(c)
