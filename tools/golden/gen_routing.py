#!/usr/bin/env python3
"""gen_routing.py — golden vectors for moerun's routing presets (tests/test_routing.c).

Each preset of shared/spec/routing.md is implemented here independently with
torch (torch.softmax / torch.sigmoid / torch.topk in fp32), on tie-free random
logits: every token is redrawn until, in float64, the keys that decide its
selection (the top k+1 keys, and for grouped routing the top topk_group+1
group scores) are separated by a relative gap of at least 1e-5, so that
torch.topk's unspecified tie order never matters and fp32 rounding cannot
reorder them.

Output (tests/data/routing/, deterministic, fixed seeds):
  manifest.txt   one line per case:
                 name method T E k n_group topk_group scale has_bias file
  <name>.bin     little-endian, concatenated:
                 logits f32[T*E], bias f32[E] (if has_bias), ids i32[T*k],
                 weights f32[T*k]   (ids in selection order: descending key)

Usage: python3 tools/golden/gen_routing.py [outdir]
"""
import os
import sys

import numpy as np
import torch

GAP = 1e-5


# ---- torch implementations of the presets (the oracle) ----
def route_torch(method, logits, bias, k, n_group, topk_group, scale):
    l = torch.from_numpy(logits)
    b = torch.from_numpy(bias) if bias is not None else None
    if method == "softmax_topk":
        v, i = torch.topk(torch.softmax(l, dim=-1), k, dim=-1, sorted=True)
        w = v
    elif method == "renormalize":
        v, i = torch.topk(torch.softmax(l, dim=-1), k, dim=-1, sorted=True)
        w = v / (v.sum(dim=-1, keepdim=True) + 1e-20)
    elif method == "topk_softmax":
        v, i = torch.topk(l, k, dim=-1, sorted=True)
        w = torch.softmax(v, dim=-1)
    elif method == "minimax2":
        s = torch.sigmoid(l)
        _, i = torch.topk(s + b, k, dim=-1, sorted=True)
        w = s.gather(1, i)
        w = w / (w.sum(dim=-1, keepdim=True) + 1e-20) * scale
    elif method == "deepseek_v3":
        s = torch.sigmoid(l)
        key = s + b
        T, E = key.shape
        if n_group > 1:
            gs = key.view(T, n_group, E // n_group).topk(2, dim=-1)[0].sum(dim=-1)
            gi = torch.topk(gs, topk_group, dim=-1, sorted=True)[1]
            gmask = torch.zeros_like(gs).scatter_(1, gi, 1.0)
            emask = gmask.unsqueeze(-1).expand(T, n_group, E // n_group).reshape(T, E)
            key = key.masked_fill(emask == 0, float("-inf"))  # -inf, not 0.0: keys can be negative
        _, i = torch.topk(key, k, dim=-1, sorted=True)
        w = s.gather(1, i)
        w = w / (w.sum(dim=-1, keepdim=True) + 1e-20) * scale
    elif method == "sigmoid_renorm":
        v, i = torch.topk(torch.sigmoid(l), k, dim=-1, sorted=True)
        w = v / (v.sum(dim=-1, keepdim=True) + 1e-20)
    elif method == "sigmoid":
        v, i = torch.topk(torch.sigmoid(l), k, dim=-1, sorted=True)
        w = v
    elif method == "llama4":
        assert k == 1
        v, i = torch.topk(l, 1, dim=-1, sorted=True)
        w = torch.sigmoid(v)
    elif method == "topk":
        v, i = torch.topk(l, k, dim=-1, sorted=True)
        w = v
    else:
        raise ValueError(method)
    return i.numpy().astype("<i4"), w.numpy().astype("<f4")


# ---- float64 keys, only to reject near-ties ----
def keys64(method, l, b):
    l = l.astype(np.float64)
    if method in ("softmax_topk", "renormalize"):
        # softmax is monotone: compare log-probabilities (relative gaps of p are differences of l)
        return l, True
    if method in ("topk_softmax", "llama4", "topk"):
        return l, False
    s = 1.0 / (1.0 + np.exp(-l))
    if method in ("minimax2", "deepseek_v3"):
        return s + b.astype(np.float64), False
    return s, False


def well_separated(vals, m, additive):
    """The top m+1 of vals are pairwise apart by GAP (relative, or absolute if additive)."""
    v = np.sort(vals)[::-1][: m + 1]
    if len(v) < 2:
        return True
    d = v[:-1] - v[1:]
    if additive:
        return bool(np.all(d >= GAP))
    scale = np.maximum(np.abs(v[:-1]), np.abs(v[1:]))
    return bool(np.all(d >= GAP * np.maximum(scale, 1e-30)))


def token_ok(method, l, b, k, n_group, topk_group):
    key, additive = keys64(method, l, b)
    E = len(key)
    if method == "deepseek_v3" and n_group > 1:
        g = key.reshape(n_group, E // n_group)
        top2 = np.sort(g, axis=1)[:, ::-1][:, :2]
        gscore = top2.sum(axis=1)
        if topk_group < n_group and not well_separated(gscore, topk_group, False):
            return False
        if topk_group < n_group:
            # also the fp32 sum of the two largest must not tie: covered by the gap
            kept = np.argsort(-gscore, kind="stable")[:topk_group]
            mask = np.zeros(n_group, bool)
            mask[kept] = True
            key = np.where(np.repeat(mask, E // n_group), key, -np.inf)
            key = key[np.isfinite(key)]
        return well_separated(key, min(k, len(key) - 1), False)
    return well_separated(key, min(k, E - 1), additive)


def make_case(rng, method, T, E, k, n_group=0, topk_group=0, scale=1.0, loc=0.0, std=2.0, bias_loc=None,
              bias_std=0.5):
    uses_bias = method in ("minimax2", "deepseek_v3")
    bias = None
    if uses_bias:
        bias = (rng.standard_normal(E) * bias_std + (bias_loc if bias_loc is not None else 0.0)).astype("<f4")
    logits = np.empty((T, E), dtype="<f4")
    for t in range(T):
        for _ in range(10000):
            row = (rng.standard_normal(E) * std + loc).astype("<f4")
            if token_ok(method, row, bias, k, n_group, topk_group):
                break
        else:
            raise RuntimeError(f"could not draw a tie-free token for {method} E={E} k={k}")
        logits[t] = row
    ids, w = route_torch(method, logits, bias, k, n_group, topk_group, np.float32(scale))
    return logits, bias, ids, w


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "..", "tests", "data",
                                                              "routing")
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(0)
    rng = np.random.default_rng(20240611)

    # (T, E, k) spread shared by every preset; llama4 uses k = 1
    spread = [(1, 8, 1), (3, 8, 2), (17, 16, 4), (300, 8, 2), (64, 64, 6), (5, 512, 8), (40, 128, 8), (2, 300, 3)]
    presets = ["softmax_topk", "renormalize", "topk_softmax", "minimax2", "deepseek_v3", "sigmoid_renorm", "sigmoid",
               "llama4", "topk"]
    cases = []  # (name, method, T, E, k, n_group, topk_group, scale, kwargs)
    for m in presets:
        for (T, E, k) in spread:
            if m == "llama4":
                k = 1
            cases.append((f"{m}_T{T}_E{E}_k{k}", m, T, E, k, 0, 0, 1.0, {}))
    # real settings
    cases.append(("minimax2_real_T300", "minimax2", 300, 256, 8, 0, 0, 1.0, {}))
    cases.append(("deepseek_v3_real_T128", "deepseek_v3", 128, 256, 8, 8, 4, 2.5, {}))
    # bias far larger than the sigmoids: key - bias would lose the weights
    cases.append(("minimax2_bigbias", "minimax2", 64, 256, 8, 0, 0, 1.0,
                  {"loc": -8.0, "std": 2.0, "bias_loc": 30.0, "bias_std": 1.0}))
    cases.append(("minimax2_scaled", "minimax2", 9, 64, 4, 0, 0, 1.75, {}))
    # grouped variants
    cases.append(("deepseek_v3_g4_tg2", "deepseek_v3", 50, 64, 4, 4, 2, 1.0, {}))
    cases.append(("deepseek_v3_g16_tg3", "deepseek_v3", 20, 512, 8, 16, 3, 2.5, {}))
    cases.append(("deepseek_v3_g8_tg8", "deepseek_v3", 30, 32, 8, 8, 8, 1.0, {}))
    cases.append(("deepseek_v3_g8_tg1", "deepseek_v3", 10, 16, 2, 8, 1, 1.0, {}))
    # negative keys: an HF-style 0.0 mask would pick experts of dropped groups
    cases.append(("deepseek_v3_negkeys", "deepseek_v3", 40, 64, 6, 8, 2, 2.5,
                  {"bias_loc": -3.0, "bias_std": 0.5}))
    cases.append(("deepseek_v3_nogroups", "deepseek_v3", 12, 64, 8, 1, 1, 1.0, {}))

    for f in os.listdir(out):
        if f.endswith(".bin") or f == "manifest.txt":
            os.remove(os.path.join(out, f))
    lines = ["# name method T E k n_group topk_group scale has_bias file  (see tools/golden/gen_routing.py)"]
    total = 0
    for (name, m, T, E, k, G, TG, scale, kw) in cases:
        logits, bias, ids, w = make_case(rng, m, T, E, k, G, TG, scale, **kw)
        fn = name + ".bin"
        with open(os.path.join(out, fn), "wb") as fh:
            fh.write(logits.astype("<f4").tobytes())
            if bias is not None:
                fh.write(bias.astype("<f4").tobytes())
            fh.write(ids.astype("<i4").tobytes())
            fh.write(w.astype("<f4").tobytes())
        total += os.path.getsize(os.path.join(out, fn))
        lines.append(f"{name} {m} {T} {E} {k} {G} {TG} {float(np.float32(scale))!r} {int(bias is not None)} {fn}")
    with open(os.path.join(out, "manifest.txt"), "w") as fh:
        fh.write("\n".join(lines) + "\n")
    print(f"wrote {len(cases)} cases, {total / 1e6:.2f} MB to {out}")


if __name__ == "__main__":
    main()
