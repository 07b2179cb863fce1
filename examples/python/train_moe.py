"""Train a tiny MoE model with xte's FP8 modules on the CPU and compare its loss curve with the
same model computed in bf16 by plain torch.

    model:  h = Linear(x); h = h + MoE(h); y = Linear(h)        (MSE regression on a fixed
            random teacher; Kimi-K2-shaped router: sigmoid scores, expert bias, top-k weights
            normalised and scaled, auxiliary-loss-free bias balancing after every step)
    xte:    xte.nn.Linear / xte.nn.MoE: block-scaled FP8 (1x128 activations and gradients,
            128x128 weights, TransformerEngine Float8BlockScaling), fp32 master weights
    bf16:   the same parameters, every GEMM with bf16 operands, fp32 accumulation and bf16
            results and gradients (bf16_linear), the router in fp32

Both start from the same weights and see the same batches; printed: both losses every
--every steps and the distance max_t |l_xte(t) - l_bf16(t)| / l_bf16(0) (the largest gap between
the curves, as a fraction of the initial loss). --check D makes the run fail (exit 1) when the
distance exceeds D.

The stated distance is DISTANCE below: 0.0075 (0.75% of the initial loss), for the default run
(200 steps, 4 experts, top-2, 64 tokens) with seeds 0, 1 and 2. Measured (seeds 0 / 1 / 2):
0.0020 / 0.0052 / 0.0037, each reached in the first 30 steps (at steps 25 / 3 / 0), so the
30-step runs of tests/python/test_nn_example.py (seeds 0 and 1) check the same maximum as the
full runs; the bound is 1.45x the largest measured value, for the bf16 model's fp32 CPU
matmuls, which may round differently on other CPUs and torch versions. Loss 0.18 -> 0.0025
(xte) and 0.18 -> 0.0023 (bf16) in 200 steps. Relative to the current loss the gap is larger
late in training: 12-14% in the last 50 steps, final xte / bf16 loss ratio 1.11-1.17 (measured,
not asserted by the test): FP8 block scaling (e4m3, 3 mantissa bits) has a higher noise floor
than bf16 (8 bits), which shows once the loss is ~1.5% of its start.

    XTE_LIBRARY=build/libxte.so PYTHONPATH=python python examples/python/train_moe.py
"""

import argparse
import sys
import time

import torch
import torch.nn.functional as F

import xte.nn as xnn

DISTANCE = 0.0075  # the stated bound on max_t |l_xte - l_bf16| / l_bf16(0) (see the module doc)

H, FFN, E, TOPK, SCALE, BATCH = 128, 64, 4, 2, 2.5, 64


class XteModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = xnn.Linear(H, H)
        self.moe = xnn.MoE(H, FFN, E, TOPK, score_function="sigmoid", scaling_factor=SCALE)
        self.out = xnn.Linear(H, H)

    def forward(self, x):
        h = self.inp(x)
        h = h + self.moe(h)
        return self.out(h)


class _Bf16(torch.autograd.Function):
    """Rounds to bf16 (RNE) forward and backward: the operands and results of a bf16 GEMM."""

    @staticmethod
    def forward(ctx, t):
        return t.to(torch.bfloat16).float()

    @staticmethod
    def backward(ctx, g):
        return g.to(torch.bfloat16).float()


def bf16_linear(x, w, b=None):
    """A bf16 GEMM as tensor cores / oneDNN run it: bf16 operands, fp32 accumulation, bf16
    result; the gradients rounded to bf16 likewise (fp32 arithmetic on bf16 values, which is
    faster than torch's bf16 matmul on CPUs without AMX)."""
    r = _Bf16.apply
    return r(F.linear(r(x), r(w), None if b is None else r(b)))


def bf16_forward(m, x):
    """The same model in bf16 (router in fp32), from XteModel m's parameters."""
    h = bf16_linear(x, m.inp.weight, m.inp.bias)
    moe = m.moe
    s = torch.sigmoid(F.linear(h, moe.gate_weight))
    idx = torch.topk(s.detach() + moe.expert_bias, TOPK, dim=-1).indices
    sel = s.gather(1, idx)
    w = sel / sel.sum(-1, keepdim=True) * SCALE
    y = torch.zeros_like(h)
    counts = torch.zeros(E, dtype=torch.int64)
    for e in range(E):
        tok, slot = (idx == e).nonzero(as_tuple=True)
        counts[e] = tok.numel()
        if tok.numel() == 0:
            continue
        a = bf16_linear(h[tok], moe.fc1.weight[e])
        a = _Bf16.apply(F.silu(a[:, :FFN]) * a[:, FFN:])
        o = bf16_linear(a, moe.fc2.weight[e])
        y = y.index_add(0, tok, o * w[tok, slot][:, None])
    h = h + y
    return bf16_linear(h, m.out.weight, m.out.bias), counts


def train(steps, every=20, seed=0, lr=2e-3, log=print):
    torch.manual_seed(seed)
    xm = XteModel()
    bm = XteModel()
    bm.load_state_dict(xm.state_dict())
    teacher = torch.nn.Sequential(torch.nn.Linear(H, H), torch.nn.Tanh(), torch.nn.Linear(H, H))
    for p in teacher.parameters():
        p.requires_grad_(False)
    ox = torch.optim.Adam(xm.parameters(), lr=lr)
    ob = torch.optim.Adam(bm.parameters(), lr=lr)
    g = torch.Generator().manual_seed(seed + 1)
    lx, lb = [], []
    t0 = time.time()
    for step in range(steps):
        x = torch.randn(BATCH, H, generator=g)
        target = teacher(x)
        loss_x = F.mse_loss(xm(x), target)
        ox.zero_grad()
        loss_x.backward()
        ox.step()
        xm.moe.update_expert_bias(1e-3)
        yb, counts = bf16_forward(bm, x)
        loss_b = F.mse_loss(yb, target)
        ob.zero_grad()
        loss_b.backward()
        ob.step()
        with torch.no_grad():
            bm.moe.tokens_per_expert.copy_(counts)
        bm.moe.update_expert_bias(1e-3)
        lx.append(float(loss_x.detach()))
        lb.append(float(loss_b.detach()))
        if log and (step % every == 0 or step == steps - 1):
            log(f"step {step:4d}  loss xte-fp8 {lx[-1]:.5f}  loss bf16 {lb[-1]:.5f}  "
                f"|diff| / initial loss {abs(lx[-1] - lb[-1]) / lb[0]:.5f}")
    dist = max(abs(a - b) for a, b in zip(lx, lb)) / lb[0]
    if log:
        log(f"{steps} steps in {time.time() - t0:.1f} s; loss {lx[0]:.4f} -> {lx[-1]:.4f} (xte), "
            f"{lb[0]:.4f} -> {lb[-1]:.4f} (bf16); final ratio {lx[-1] / lb[-1]:.3f}; "
            f"max |l_xte - l_bf16| / l_bf16(0) = {dist:.5f} (stated bound {DISTANCE})")
    return lx, lb, dist


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--every", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--check", type=float, default=None,
                    help=f"fail when the distance exceeds this (the stated bound: {DISTANCE})")
    a = ap.parse_args(argv)
    _, _, dist = train(a.steps, a.every, a.seed)
    if a.check is not None and not dist <= a.check:
        print(f"FAILED: max relative distance {dist:.4f} > {a.check}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
