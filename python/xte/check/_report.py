"""Verdicts and reports of xte.check.

A Verdict judges one tensor (PASS / FAIL and why, the statistics behind it, the first examples
of each difference); a Report collects the verdicts of one or more checks and renders them as
JSON (for CI pipelines) and as a short human table.
"""

import json
import math

__all__ = ["Verdict", "Report"]


def _jsonable(v):
    """Plain JSON values: NumPy scalars / arrays to Python, non-finite floats to strings."""
    import numpy as np
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, np.ndarray):
        return _jsonable(v.tolist())
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (np.floating, float)):
        f = float(v)
        if math.isnan(f):
            return "nan"
        if math.isinf(f):
            return "inf" if f > 0 else "-inf"
        return f
    if isinstance(v, (np.bool_,)):
        return bool(v)
    return v


class Verdict:
    """The judgement of one tensor.

    name: the tensor ('data', 'scale_inv', 'out', 'dq', 'probs', ...); family: 'quantize',
    'cast', 'gemm', 'attention', 'router', 'aux_loss', 'permute', 'unpermute'; passed: bool;
    why: one line; classes: {difference class: count}; stats: numbers behind the verdict;
    examples: up to a few dicts (index, input, expected, got, class)."""

    __slots__ = ("name", "family", "passed", "why", "classes", "stats", "examples")

    def __init__(self, name, family, passed, why, classes=None, stats=None, examples=None):
        self.name = name
        self.family = family
        self.passed = bool(passed)
        self.why = why
        self.classes = dict(classes or {})
        self.stats = dict(stats or {})
        self.examples = list(examples or [])

    @property
    def status(self):
        return "PASS" if self.passed else "FAIL"

    def line(self):
        """The verdict line: 'PASS quantize data: why'."""
        return f"{self.status} {self.family} {self.name}: {self.why}"

    def as_dict(self):
        return _jsonable({"name": self.name, "family": self.family, "status": self.status,
                          "why": self.why, "classes": self.classes, "stats": self.stats,
                          "examples": self.examples})

    def __repr__(self):
        return f"Verdict({self.line()!r})"


class Report:
    """Verdicts of one or more checks. `ok` is True when every verdict passed; `notes` records
    what the check did besides judging (CUDA tensors copied to the host, the claim checked)."""

    def __init__(self, verdicts=None, claim=None, notes=None):
        self.verdicts = list(verdicts or [])
        self.claim = dict(claim or {})
        self.notes = list(notes or [])

    @property
    def ok(self):
        return all(v.passed for v in self.verdicts)

    def __iter__(self):
        return iter(self.verdicts)

    def __len__(self):
        return len(self.verdicts)

    def __getitem__(self, name):
        """The verdict of a tensor by name (the first of that name), or by position."""
        if isinstance(name, int):
            return self.verdicts[name]
        for v in self.verdicts:
            if v.name == name:
                return v
        raise KeyError(name)

    def extend(self, other):
        self.verdicts.extend(other.verdicts)
        self.notes.extend(n for n in other.notes if n not in self.notes)
        for k, v in other.claim.items():
            self.claim.setdefault(k, v)
        return self

    def as_dict(self):
        return _jsonable({"ok": self.ok, "claim": self.claim, "notes": self.notes,
                          "verdicts": [v.as_dict() for v in self.verdicts]})

    def to_json(self, indent=2):
        return json.dumps(self.as_dict(), indent=indent, allow_nan=False)

    def table(self, examples=3):
        """A short human table: one verdict line per tensor, the difference classes with their
        counts and the first examples of each failing tensor."""
        rows = [("status", "family", "tensor", "why")]
        for v in self.verdicts:
            rows.append((v.status, v.family, v.name, v.why))
        w = [max(len(r[i]) for r in rows) for i in range(3)]
        out = []
        for r in rows:
            out.append(f"{r[0]:<{w[0]}}  {r[1]:<{w[1]}}  {r[2]:<{w[2]}}  {r[3]}")
        for v in self.verdicts:
            if v.passed and not v.classes:
                continue
            if v.classes:
                cls = ", ".join(f"{k}: {n}" for k, n in v.classes.items())
                out.append(f"  {v.name}: {cls}")
            if not v.passed:
                for e in v.examples[:examples]:
                    out.append("    " + ", ".join(f"{k}={_fmt(x)}" for k, x in e.items()))
        for n in self.notes:
            out.append(f"note: {n}")
        out.append("PASS" if self.ok else
                   f"FAIL ({sum(not v.passed for v in self.verdicts)} of {len(self.verdicts)})")
        return "\n".join(out)

    def __str__(self):
        return self.table()

    def __repr__(self):
        return f"Report(ok={self.ok}, verdicts={len(self.verdicts)})"


def _fmt(x):
    if isinstance(x, float):
        return f"{x:.9g}"
    return str(x)
