#!/usr/bin/env python3
"""gen_formats.py — golden vectors for moerun's formats/ module.

Writes raw little-endian binary files and a manifest into tests/data/formats/.
Every expected output comes from an independent library, never from moerun:

  bf16  torch (c10 conversion; NaN edge cases through the 0-d scalar path,
        which gives 0x7FC0 — torch's vectorized path gives 0xFFFF instead)
  f16   numpy astype(float16)
  e4m3  ml_dtypes.float8_e4m3fn (non-saturating; torch >= 2.x CPU saturates)
  e5m2  ml_dtypes.float8_e5m2
  e2m1  ml_dtypes.float4_e2m1fn (checked against the spec's threshold table
        and ModelOpt's _cast_fp4 below; NaN excluded: ml_dtypes maps NaN to
        the nibble 8/0, which the spec does not define)
  NVFP4 weights      a torch/ml_dtypes transliteration of ModelOpt 0.47
                     NVFP4QTensor.quantize, cross-checked against nvidia-modelopt
                     itself when it can be imported (it runs on CPU)
  FP8 block weights  a torch transliteration of HF FineGrainedFP8 Fp8Quantize,
                     cross-checked against transformers' own Fp8Quantize for the
                     128-divisible shapes
  FP8 1x128 act      transliteration of vLLM per_token_group_quant_fp8 (eps 1e-10)
  NVFP4 W4A4 act     transliteration of vLLM ref_nvfp4_quant, with its own
                     cast_to_fp4 used as a value cross-check

Deterministic (fixed seeds). Run: python3 tools/golden/gen_formats.py
For the ModelOpt cross-check, run it from a virtual environment that has
nvidia-modelopt (pip install --no-deps nvidia-modelopt omegaconf pulp scipy);
without it the check is skipped and says so. Output is identical either way
except for the "(= nvidia-modelopt)" notes in MANIFEST.
"""
import os
import sys

import ml_dtypes as md
import numpy as np
import torch

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "data", "formats")
manifest = []


def save(name, arr, what):
    arr = np.ascontiguousarray(arr)
    assert arr.dtype.byteorder in ("<", "=", "|")
    arr.tofile(os.path.join(OUT, name))
    manifest.append(f"{name}\t{arr.dtype.name}\t{arr.size}\t{what}")


def f32(bits):
    return np.array(bits, dtype=np.uint32).view(np.float32)


# ---------------------------------------------------------------- encoders
def enc_bf16(x):
    out = torch.from_numpy(x.copy()).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16).copy()
    nan = np.isnan(x)
    for i in np.nonzero(nan)[0]:  # c10 scalar path: torch.tensor(0-d).to(bf16)
        out[i] = np.uint16(torch.tensor(float(x[i])).to(torch.bfloat16).view(torch.int16).item() & 0xFFFF)
    return out


def enc_f16(x):
    return x.astype(np.float16).view(np.uint16)


def enc_e4m3(x):
    return x.astype(md.float8_e4m3fn).view(np.uint8)


def enc_e5m2(x):
    return x.astype(md.float8_e5m2).view(np.uint8)


def enc_e2m1(x):
    return x.astype(md.float4_e2m1fn).view(np.uint8) & 0xF


E2M1_VALS = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], dtype=np.float32)


def e2m1_spec_table(x):
    """The spec's threshold table, written independently of ml_dtypes."""
    a = np.abs(x)
    code = np.select(
        [a <= 0.25, a < 0.75, a <= 1.25, a < 1.75, a <= 2.5, a < 3.5, a <= 5.0], [0, 1, 2, 3, 4, 5, 6], 7
    ).astype(np.uint8)
    return code | (np.signbit(x).astype(np.uint8) << 3)


def dec_e4m3(b):
    return np.asarray(b, dtype=np.uint8).view(md.float8_e4m3fn).astype(np.float32)


def pack_nibbles(codes):
    codes = codes.reshape(*codes.shape[:-1], -1, 2)
    return (codes[..., 0] | (codes[..., 1] << 4)).astype(np.uint8)


# ---------------------------------------------------------------- grids / ties
def grid_ties(dec_all):
    v = np.unique(dec_all[np.isfinite(dec_all)].astype(np.float64))
    v = v[v >= 0]
    mids = (v[:-1] + v[1:]) / 2
    return mids.astype(np.float32)[(mids.astype(np.float32) == mids)]  # exactly representable ties


def random_inputs(n, rng):
    parts = []
    # any finite fp32 bit pattern (huge, tiny, subnormal)
    b = rng.integers(0, 2**32, size=n // 4, dtype=np.uint64).astype(np.uint32)
    b = b[(b & 0x7F800000) != 0x7F800000]
    parts.append(b.view(np.float32))
    # log-uniform magnitudes over the ranges the small formats cover
    e = rng.uniform(-30, 20, size=n // 4)
    parts.append((np.sign(rng.standard_normal(n // 4)) * 2.0**e).astype(np.float32))
    # gaussian weights at several scales
    s = 2.0 ** rng.integers(-12, 10, size=n // 4)
    parts.append((rng.standard_normal(n // 4) * s).astype(np.float32))
    # exact ties and their neighbours for every encoder's grid
    ties = []
    ties.append(grid_ties(np.arange(256, dtype=np.uint8).view(md.float8_e4m3fn).astype(np.float32)))
    ties.append(grid_ties(np.arange(256, dtype=np.uint8).view(md.float8_e5m2).astype(np.float32)))
    ties.append(grid_ties(E2M1_VALS))
    bf = rng.integers(0, 0x7F80, size=4000).astype(np.uint32) << 16
    ties.append(f32(bf | 0x8000))  # bf16 ties
    h = rng.integers(0, 0x7C00, size=4000).astype(np.uint16).view(np.float16).astype(np.float32)
    h1 = (h.view(np.uint32) + 0x1000).view(np.float32)  # f16 ties (normal range)
    ties.append(h1)
    sub = (rng.integers(0, 1024, size=2000) * 2 + 1).astype(np.float32) * np.float32(2.0**-25)  # f16 sub ties
    ties.append(sub)
    t = np.concatenate(ties).astype(np.float32)
    t = np.concatenate([t, np.nextafter(t, np.float32(np.inf)), np.nextafter(t, np.float32(0))])
    t = t * np.where(rng.random(t.size) < 0.5, np.float32(-1), np.float32(1))
    parts.append(t.astype(np.float32))
    x = np.concatenate(parts).astype(np.float32)
    rng.shuffle(x)
    return x[: max(n, 100000)] if x.size >= n else x


EDGE = np.concatenate(
    [
        np.array(
            [0.0, -0.0, 448, 449, 464, 464.01, 480, -500, 2**-10, 0.0029296875, 1.0625, 1.1875, 17, 248,
             57344, 61440, 61439.99, 65504, 65519.99, 65520, 2**-9, 2**-6, 2**-16, 2**-17, 2**-14, 2**-24,
             2**-25, 2**-25 * 1.0001, 3 * 2**-26, 0.25, 0.2500001, 0.75, 0.7499999, 1.25, 1.2500001, 1.75,
             1.7499999, 2.5, 2.5000002, 3.5, 3.4999998, 5.0, 5.0000005, 6.0, 7.0, 1e30, 3.4028235e38,
             1.0000001, 1.00390625, 1.01171875, -1.00390625, 0.1, 1 / 3],
            dtype=np.float32),
        f32([0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00000, 0x7F800001, 0x7FBFFFFF, 0x00000001, 0x80000001,
             0x007FFFFF, 0x00800000, 0x3F808000, 0x3F818000, 0x7F7FFFFF, 0x477FF000, 0x477FEFFF, 0x43E80000,
             0x43E80001, 0x47700000, 0x476FFFFF]),
    ]
)
EDGE = np.concatenate([EDGE, -EDGE]).astype(np.float32)


def main():
    np.seterr(all="ignore")
    import warnings
    warnings.filterwarnings("ignore")
    os.makedirs(OUT, exist_ok=True)
    for f in os.listdir(OUT):
        os.remove(os.path.join(OUT, f))
    rng = np.random.default_rng(20240601)

    # --- decoders: every byte of E4M3 / E5M2, all 16 E2M1 codes, every f16
    allb = np.arange(256, dtype=np.uint8)
    save("dec_e4m3.f32", allb.view(md.float8_e4m3fn).astype(np.float32), "e4m3 byte i decoded (ml_dtypes)")
    save("dec_e5m2.f32", allb.view(md.float8_e5m2).astype(np.float32), "e5m2 byte i decoded (ml_dtypes)")
    save("dec_e2m1.f32", np.arange(16, dtype=np.uint8).view(md.float4_e2m1fn).astype(np.float32),
         "e2m1 nibble i decoded (ml_dtypes)")
    save("dec_f16.f32", np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32),
         "f16 pattern i decoded (numpy)")

    # --- encoders on edge values and random values
    rnd = random_inputs(100000, rng)
    assert rnd.size >= 100000 and np.all(np.isfinite(rnd))
    save("enc_edge_in.f32", EDGE, "edge inputs")
    save("enc_rand_in.f32", rnd, "random inputs (finite, incl. subnormal/huge, grid ties)")
    noNaN = ~np.isnan(EDGE)
    for name, fn, dt in [("bf16", enc_bf16, "u16 torch"), ("f16", enc_f16, "u16 numpy"),
                         ("e4m3", enc_e4m3, "u8 ml_dtypes"), ("e5m2", enc_e5m2, "u8 ml_dtypes")]:
        save(f"enc_edge_{name}.bin", fn(EDGE), f"{name} of enc_edge_in ({dt})")
        save(f"enc_rand_{name}.bin", fn(rnd), f"{name} of enc_rand_in ({dt})")
    # e2m1: NaN inputs excluded from the edge set (not defined by the spec).
    e2 = EDGE[noNaN]
    ce, cr = enc_e2m1(e2), enc_e2m1(rnd)
    assert np.array_equal(ce, e2m1_spec_table(e2)) and np.array_equal(cr, e2m1_spec_table(rnd)), \
        "ml_dtypes float4_e2m1fn disagrees with the spec table"
    save("enc_edge_e2m1_in.f32", e2, "edge inputs without NaN")
    save("enc_edge_e2m1.bin", ce, "e2m1 nibble of enc_edge_e2m1_in (ml_dtypes)")
    save("enc_rand_e2m1.bin", cr, "e2m1 nibble of enc_rand_in (ml_dtypes)")
    # spec table check of the e4m3 test points
    for v, b in [(448, 0x7E), (449, 0x7E), (464, 0x7E), (464.01, 0x7F), (480, 0x7F), (np.inf, 0x7F),
                 (-500, 0xFF), (2**-10, 0), (0.0029296875, 2), (1.0625, 0x38), (1.1875, 0x3A), (17, 0x58),
                 (248, 0x78)]:
        assert enc_e4m3(np.array([v], np.float32))[0] == b, v

    gen_nvfp4(rng)
    gen_fp8_block(rng)
    gen_act(rng)

    with open(os.path.join(OUT, "MANIFEST"), "w") as f:
        f.write("# tests/data/formats — written by tools/golden/gen_formats.py; raw little-endian arrays\n")
        f.write("# file\tdtype\tcount\tcontents\n")
        f.write("\n".join(manifest) + "\n")
    total = sum(os.path.getsize(os.path.join(OUT, f)) for f in os.listdir(OUT))
    print(f"wrote {len(manifest)} files, {total} bytes, to {os.path.normpath(OUT)}")


# ---------------------------------------------------------------- NVFP4 weights
def nvfp4_quantize_ref(w, shared_amax=None):
    """ModelOpt 0.47 NVFP4QTensor.quantize, written out with torch fp32 ops.
    The e2m1 cast uses ml_dtypes (keeps the sign of -0; ModelOpt writes 0)."""
    wt = torch.from_numpy(w)
    amax = torch.tensor(np.float32(shared_amax)) if shared_amax else wt.abs().amax().float()
    ws2 = amax / (6.0 * 448.0)
    blk = wt.view(w.shape[0], -1, 16)
    bmax = blk.abs().amax(dim=-1).float()
    t = bmax / (6.0 * ws2)
    t[t == 0] = 1.0
    sc = t.clamp(min=2**-9, max=448.0).to(torch.float8_e4m3fn)
    d = sc.to(torch.float32) * ws2
    scaled = (blk / d.unsqueeze(-1)).reshape(w.shape).numpy()
    codes = enc_e2m1(scaled)
    return pack_nibbles(codes), sc.view(torch.uint8).numpy(), np.float32(ws2.item())


def nvfp4_check_modelopt(w, packed, sc, ws2, shared_amax):
    try:
        import warnings
        warnings.filterwarnings("ignore")
        from modelopt.torch.quantization.qtensor.nvfp4_tensor import NVFP4QTensor
    except Exception as e:  # noqa: BLE001
        print(f"  nvidia-modelopt not importable ({type(e).__name__}); NVFP4 cross-check skipped")
        return False
    wt = torch.from_numpy(w.copy())
    ws2_in = torch.tensor(np.float32(shared_amax) / np.float32(2688.0)) if shared_amax else None
    q, s, s2 = NVFP4QTensor.quantize(wt, 16, weights_scaling_factor_2=ws2_in)
    mq = q._quantized_data.numpy()
    assert np.float32(s2.item()) == ws2, (s2, ws2)
    assert np.array_equal(s.view(torch.uint8).numpy(), sc), "modelopt scales differ"
    assert np.array_equal(mq, packed), "modelopt codes differ"
    return True


def gen_nvfp4(rng):
    mats = []
    a = (rng.standard_normal((64, 128)) * 0.02).astype(np.float32)
    mats.append(("nvfp4_a", a, 0.0))
    b = (rng.standard_normal((96, 256)) * 0.05).astype(np.float32)
    b[3, 17] = 4.0          # outliers
    b[50, 200] = -7.5
    b[10, 32:48] = 0.0      # a zero block
    b[11, 0:16] *= 1e-6     # a block far below the tensor's amax (scale clamped to 2^-9)
    b[12, 16:32] = 1e-9
    b[20, 64:80] = np.float32(0.046875) * np.arange(-8, 8)  # exact grid points / ties
    mats.append(("nvfp4_b", b, 0.0))
    c = (rng.standard_normal((32, 64)) * 0.1).astype(np.float32)
    mats.append(("nvfp4_c_shared", c, float(np.abs(c).max() * 2.5)))
    for name, w, shared in mats:
        assert not np.any((w == 0) & np.signbit(w))  # ModelOpt writes 0 for -0.0, we keep the sign
        packed, sc, ws2 = nvfp4_quantize_ref(w, shared or None)
        checked = nvfp4_check_modelopt(w, packed, sc, ws2, shared or None)
        tag = " (= nvidia-modelopt)" if checked else ""
        save(f"{name}_w.f32", w, f"NVFP4 input [{w.shape[0]}][{w.shape[1]}], shared_amax={shared!r}")
        save(f"{name}_q.u8", packed, "packed E2M1 codes [N][K/2]" + tag)
        save(f"{name}_sc.u8", sc, "E4M3 block scales [N][K/16]" + tag)
        save(f"{name}_s2.f32", np.array([ws2], np.float32), "weight_scale_2" + tag)
        # ModelOpt dequantization: e2m1 * (scale * ws2)
        vals = E2M1_VALS[np.stack([packed & 0xF, packed >> 4], -1).reshape(w.shape)]
        d = dec_e4m3(sc) * ws2
        deq = (vals.reshape(w.shape[0], -1, 16) * d[..., None]).reshape(w.shape).astype(np.float32)
        save(f"{name}_deq.f32", deq, "dequantized e2m1*(sc*ws2)")
        manifest.append(f"#shape {name} {w.shape[0]} {w.shape[1]} {shared!r}")


# ---------------------------------------------------------------- FP8 block weights
def fp8_block_ref(w):
    """HF Fp8Quantize per 128x128 block (partial edge blocks use their own amax)."""
    n, k = w.shape
    wt = torch.from_numpy(w)
    q = torch.empty(n, k, dtype=torch.uint8)
    nbr, nbc = -(-n // 128), -(-k // 128)
    sinv = torch.empty(nbr, nbc, dtype=torch.float32)
    for i in range(nbr):
        for j in range(nbc):
            blk = wt[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128]
            amax = blk.abs().amax()
            # exactly HF's expression: torch evaluates `float / tensor` as
            # reciprocal(tensor) * float, i.e. 448 * (1/amax) with two roundings
            s = 448.0 / amax if amax > 0 else torch.tensor(1.0)
            assert amax == 0 or s.item() == np.float32(448.0) * (np.float32(1.0) / np.float32(amax.item()))
            s = s.to(torch.float32)
            qb = torch.clamp(blk * s, min=-448.0, max=448.0).numpy()
            q[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128] = torch.from_numpy(enc_e4m3(qb).copy())
            sinv[i, j] = (1.0 / s).to(torch.float32)
    return q.numpy(), sinv.numpy()


def fp8_check_hf(w, q, sinv):
    try:
        from types import SimpleNamespace

        from transformers.integrations.finegrained_fp8 import Fp8Quantize
    except Exception as e:  # noqa: BLE001
        print(f"  transformers Fp8Quantize not importable ({type(e).__name__}); cross-check skipped")
        return False
    hq = SimpleNamespace(quantization_config=SimpleNamespace(weight_block_size=(128, 128), scale_fmt=None))
    r = Fp8Quantize(hq).convert({"x.weight": torch.from_numpy(w.copy())})
    assert np.array_equal(r["x.weight"].view(torch.uint8).numpy(), q), "HF fp8 codes differ"
    assert np.array_equal(r["x.weight_scale_inv"].numpy(), sinv), "HF fp8 scales differ"
    return True


def gen_fp8_block(rng):
    a = (rng.standard_normal((256, 384)) * 0.03).astype(np.float32)
    a[0:128, 128:256] = 0.0  # a zero block: scale 1
    a[200, 300] = 3.0
    b = (rng.standard_normal((200, 300)) * 0.5).astype(np.float32)  # partial edge blocks
    b[199, 299] = -40.0
    b[130, 5] = 1e-30
    for name, w in [("fp8b_a", a), ("fp8b_b", b)]:
        q, sinv = fp8_block_ref(w)
        tag = ""
        if w.shape[0] % 128 == 0 and w.shape[1] % 128 == 0 and fp8_check_hf(w, q, sinv):
            tag = " (= transformers Fp8Quantize)"
        save(f"{name}_w.f32", w, f"FP8 block input [{w.shape[0]}][{w.shape[1]}]")
        save(f"{name}_q.u8", q, "E4M3 codes [N][K]" + tag)
        save(f"{name}_s.f32", sinv, "weight_scale_inv [ceil(N/128)][ceil(K/128)]" + tag)
        manifest.append(f"#shape {name} {w.shape[0]} {w.shape[1]}")


# ---------------------------------------------------------------- activations
def gen_act(rng):
    # FP8 1x128 dynamic (vLLM per_token_group_quant_fp8, eps 1e-10), rows of 300 (partial last group)
    x = (rng.standard_normal((4, 300)) * 2.0).astype(np.float32)
    x[1, 128:256] = 0.0
    x[2, 0:128] *= 1e-12
    x[3, 7] = 1000.0
    xt = torch.from_numpy(x)
    qs, ss = [], []
    for r in range(x.shape[0]):
        for g in range(0, 300, 128):
            grp = xt[r, g:g + 128]
            s = torch.clamp(grp.abs().amax(), min=1e-10) / 448.0
            qs.append(enc_e4m3(torch.clamp(grp / s, -448.0, 448.0).numpy()))
            ss.append(np.float32(s.item()))
    save("act_fp8_x.f32", x, "FP8 act input [4][300]")
    save("act_fp8_q.u8", np.concatenate(qs), "E4M3 codes [4][300]")
    save("act_fp8_s.f32", np.array(ss, np.float32), "scales [4][3]")

    # NVFP4 W4A4 (vLLM ref_nvfp4_quant), rows of 256
    x = (rng.standard_normal((4, 256)) * 1.5).astype(np.float32)
    calib_amax = np.float32(np.abs(x).max() * 0.8)  # some values exceed the calibrated range
    x[0, 0:16] = 0.0
    x[1, 16:32] *= np.float32(1e-7)                    # scale rounds to 0 -> output scale 0
    x[2, 32:48] = np.float32(0.25) * np.arange(-8, 8)  # ties on the E2M1 grid
    input_scale = np.float32(calib_amax / np.float32(2688.0))
    gs = torch.tensor(np.float32(1.0) / input_scale)
    xt = torch.from_numpy(x).reshape(4, -1, 16)
    vmax = xt.abs().amax(dim=-1, keepdim=True).float()
    scale = gs * (vmax * (1.0 / 6.0))
    scale = torch.clamp(scale, max=448, min=-448).to(torch.float8_e4m3fn)
    p = scale.to(torch.float32) * torch.where(gs == 0, torch.tensor(0.0), 1.0 / gs)
    os_ = torch.where(p == 0, torch.tensor(0.0), 1.0 / p)
    scaled = torch.clamp(xt * os_, -6.0, 6.0).reshape(4, 256)
    codes = enc_e2m1(scaled.numpy())
    # vLLM's own cast_to_fp4 gives the same values (it returns values, not codes)
    v = scaled.clone()
    sign = torch.sign(v)
    v = v.abs()
    v[(v >= 0.0) & (v <= 0.25)] = 0.0
    v[(v > 0.25) & (v < 0.75)] = 0.5
    v[(v >= 0.75) & (v <= 1.25)] = 1.0
    v[(v > 1.25) & (v < 1.75)] = 1.5
    v[(v >= 1.75) & (v <= 2.5)] = 2.0
    v[(v > 2.5) & (v < 3.5)] = 3.0
    v[(v >= 3.5) & (v <= 5.0)] = 4.0
    v[v > 5.0] = 6.0
    assert np.array_equal((v * sign).numpy(), E2M1_VALS[codes]), "vLLM cast_to_fp4 disagrees"
    sc = scale.view(torch.uint8).reshape(4, -1).numpy()
    deq = (E2M1_VALS[codes].reshape(4, -1, 16) * (dec_e4m3(sc) * input_scale)[..., None]).reshape(4, 256)
    save("act_nvfp4_x.f32", x, "NVFP4 act input [4][256]")
    save("act_nvfp4_is.f32", np.array([input_scale], np.float32), "input_scale")
    save("act_nvfp4_q.u8", pack_nibbles(codes), "packed E2M1 [4][128]")
    save("act_nvfp4_sc.u8", sc, "E4M3 scales [4][16]")
    save("act_nvfp4_deq.f32", deq.astype(np.float32), "e2m1*(sc*input_scale)")


if __name__ == "__main__":
    sys.exit(main())
