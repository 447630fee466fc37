#!/usr/bin/env python3
"""gguf_convert.py — converts a moerun MiniMax-M2 checkpoint (gen-tiny or
quantize output: config.json + model.safetensors, bf16 / native FP8 /
ModelOpt NVFP4) into a GGUF file that llama.cpp loads as `minimax-m2`.

    python gguf_convert.py CKPT OUT.gguf --type q8_0|q4_0|nvfp4|bf16

Needs numpy and the `gguf` package only (no torch): the safetensors header is
read here and tensors are memory-mapped. The expert weights become the 3-D
tensors llama.cpp expects (ffn_{gate,up,down}_exps [expert][rows][cols]),
converted one expert at a time, so memory stays near one expert tensor.

  --type q8_0   experts and attention projections: dequantized, then Q8_0
                (gguf's reference quantizer); beside moerun's fp8.
  --type q4_0   the same with Q4_0 (llama.cpp's fastest 4-bit CPU format,
                repacked at load); beside moerun's nvfp4.
  --type nvfp4  NVFP4 checkpoints only: the E2M1 codes and E4M3 block scales
                repacked bit for bit into ggml's NVFP4 blocks. llama.cpp's
                minimax-m2 graph applies no per-tensor scale, so
                weight_scale_2 is left out: the bytes and the work are the
                same, the outputs differ by that per-tensor factor.
  --type bf16   experts and projections in BF16.
Embeddings, lm_head and (nvfp4 checkpoints) attention stay BF16 as stored;
norms, the router and its bias are F32. The vocabulary is llama.cpp's "none"
model with vocab_size dummy tokens: prompts are token ids, as in moerun.

The output is written to OUT.tmp and renamed when complete; a failure leaves
no OUT. Exit status: 0 written, 2 bad usage or input.
"""
import argparse
import json
import os
import struct
import sys

import numpy as np

try:
    import gguf
except ImportError:  # pragma: no cover
    sys.exit("gguf_convert: needs the gguf package (bench/peers/llamacpp_setup.sh installs it)")


def die(msg):
    print(f"gguf_convert: {msg}", file=sys.stderr)
    sys.exit(2)


# ---------------- safetensors, read here ----------------
ST_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16, "F8_E4M3": np.uint8, "U8": np.uint8,
             "I8": np.int8}


class Checkpoint:
    def __init__(self, folder):
        self.folder = folder
        self.tensors = {}  # name -> (file, dtype str, shape, offset, nbytes)
        idx = os.path.join(folder, "model.safetensors.index.json")
        files = []
        if os.path.exists(idx):
            with open(idx) as f:
                files = sorted(set(json.load(f)["weight_map"].values()))
        elif os.path.exists(os.path.join(folder, "model.safetensors")):
            files = ["model.safetensors"]
        else:
            die(f"{folder}: no model.safetensors(.index.json)")
        self.maps = {}
        for fn in files:
            path = os.path.join(folder, fn)
            with open(path, "rb") as f:
                n = struct.unpack("<Q", f.read(8))[0]
                head = json.loads(f.read(n))
            mm = np.memmap(path, dtype=np.uint8, mode="r")
            self.maps[fn] = mm
            for name, t in head.items():
                if name == "__metadata__":
                    continue
                a, b = t["data_offsets"]
                self.tensors[name] = (fn, t["dtype"], tuple(t["shape"]), 8 + n + a, b - a)
        with open(os.path.join(folder, "config.json")) as f:
            self.config = json.load(f)

    def has(self, name):
        return name in self.tensors

    def raw(self, name):
        if name not in self.tensors:
            die(f"tensor {name} is missing")
        fn, dt, shape, off, nb = self.tensors[name]
        if dt not in ST_DTYPES:
            die(f"tensor {name}: dtype {dt} not handled")
        return self.maps[fn][off:off + nb].view(ST_DTYPES[dt]).reshape(shape), dt


def bf16_to_f32(u16):
    return (u16.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16(f):
    u = np.ascontiguousarray(f, dtype=np.float32).view(np.uint32)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where((u & 0x7FFFFFFF) > 0x7F800000, np.uint16(0x7FC0), r)


def e4m3_table():
    t = np.zeros(256, dtype=np.float32)
    for c in range(256):
        s = -1.0 if c & 0x80 else 1.0
        e, m = (c >> 3) & 15, c & 7
        if e == 15 and m == 7:
            t[c] = np.nan
        elif e == 0:
            t[c] = s * m * 2.0 ** -9
        else:
            t[c] = s * (1 + m / 8) * 2.0 ** (e - 7)
    return t


E4M3 = e4m3_table()
E2M1 = np.array([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6], dtype=np.float32)


def dequant(ck, prefix):
    """fp32 [rows][cols] of weight `prefix`.weight in any of the three forms"""
    w, dt = ck.raw(prefix + ".weight")
    if dt == "BF16":
        return bf16_to_f32(w)
    if dt == "F32":
        return np.array(w, dtype=np.float32)
    if dt == "F8_E4M3":
        s, _ = ck.raw(prefix + ".weight_scale_inv")
        v = E4M3[w]
        rows, cols = v.shape
        sx = np.repeat(np.repeat(np.asarray(s, dtype=np.float32), 128, axis=0)[:rows], 128, axis=1)[:, :cols]
        return v * sx
    if dt == "U8":  # ModelOpt NVFP4: two E2M1 codes a byte (low nibble first), E4M3 per 16, scale_2
        sc, _ = ck.raw(prefix + ".weight_scale")
        s2, _ = ck.raw(prefix + ".weight_scale_2")
        codes = np.stack([w & 15, w >> 4], axis=-1).reshape(w.shape[0], -1)
        return E2M1[codes] * np.repeat(E4M3[sc] * np.float32(s2), 16, axis=1)
    die(f"{prefix}: dtype {dt} not handled")


def nvfp4_repack(ck, prefix):
    """ggml NVFP4 blocks (uint8 [rows][cols/64*36]) of a ModelOpt NVFP4 weight, bit for bit"""
    w, dt = ck.raw(prefix + ".weight")
    if dt != "U8":
        die(f"--type nvfp4 needs an NVFP4 checkpoint ({prefix} is {dt})")
    sc, _ = ck.raw(prefix + ".weight_scale")
    rows, half = w.shape
    cols = 2 * half
    if cols % 64:
        die(f"{prefix}: {cols} columns is not a multiple of 64 (ggml NVFP4 blocks)")
    codes = np.stack([w & 15, w >> 4], axis=-1).reshape(rows, cols // 16, 16)
    qs = (codes[:, :, :8] | (codes[:, :, 8:] << 4)).astype(np.uint8).reshape(rows, cols // 64, 32)
    d = (np.asarray(sc) & 0x7F).astype(np.uint8).reshape(rows, cols // 64, 4)
    return np.concatenate([d, qs], axis=-1).reshape(rows, cols // 64 * 36)


QTYPE = {"q8_0": gguf.GGMLQuantizationType.Q8_0, "q4_0": gguf.GGMLQuantizationType.Q4_0,
         "nvfp4": gguf.GGMLQuantizationType.NVFP4, "bf16": gguf.GGMLQuantizationType.BF16}


def encode(arr, qt):
    """fp32 [rows][cols] -> (bytes array, ggml type) in quantization qt"""
    if qt == gguf.GGMLQuantizationType.BF16:
        return f32_to_bf16(arr), qt
    return gguf.quants.quantize(np.ascontiguousarray(arr, dtype=np.float32), qt), qt


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("ckpt")
    ap.add_argument("out")
    ap.add_argument("--type", choices=sorted(QTYPE), required=True)
    a = ap.parse_args()
    if not os.path.isdir(a.ckpt):
        die(f"{a.ckpt}: not a folder")
    ck = Checkpoint(a.ckpt)
    c = ck.config
    if c.get("architectures", [None])[0] != "MiniMaxM2ForCausalLM":
        die(f"{a.ckpt}: architecture {c.get('architectures')} is not MiniMaxM2ForCausalLM")
    qt = QTYPE[a.type]
    L, E, H, I = c["num_hidden_layers"], c["num_local_experts"], c["hidden_size"], c["intermediate_size"]
    nh, nkv, hd = c["num_attention_heads"], c["num_key_value_heads"], c.get("head_dim", H // c["num_attention_heads"])
    blk = 64 if a.type == "nvfp4" else 32
    if H % blk or I % blk:
        die(f"hidden {H} and expert dim {I} must be multiples of {blk} for {a.type}")
    arch = gguf.MODEL_ARCH.MINIMAXM2
    name = gguf.TENSOR_NAMES
    T = gguf.MODEL_TENSOR
    tmp = a.out + ".tmp"
    w = gguf.GGUFWriter(tmp, gguf.MODEL_ARCH_NAMES[arch], use_temp_file=False)
    w.add_name(os.path.basename(os.path.normpath(a.ckpt)))
    w.add_block_count(L)
    w.add_context_length(min(int(c.get("max_position_embeddings", 4096)), 1 << 20))
    w.add_embedding_length(H)
    w.add_feed_forward_length(I)
    w.add_expert_feed_forward_length(I)
    w.add_head_count(nh)
    w.add_head_count_kv(nkv)
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_rope_dimension_count(c.get("rotary_dim", hd))
    w.add_rope_freq_base(float(c.get("rope_theta", 10000.0)))
    w.add_layer_norm_rms_eps(float(c.get("rms_norm_eps", 1e-6)))
    w.add_expert_count(E)
    w.add_expert_used_count(c["num_experts_per_tok"])
    w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID if c.get("scoring_func") == "sigmoid"
                             else gguf.ExpertGatingFuncType.SOFTMAX)
    w.add_vocab_size(c["vocab_size"])
    w.add_tokenizer_model("none")
    w.add_file_type({"q8_0": gguf.LlamaFileType.MOSTLY_Q8_0, "q4_0": gguf.LlamaFileType.MOSTLY_Q4_0,
                     "nvfp4": gguf.LlamaFileType.MOSTLY_NVFP4, "bf16": gguf.LlamaFileType.MOSTLY_BF16}[a.type])
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)

    # the plan: (gguf name, numpy byte shape, ggml type, producer)
    plan = []

    def f32(src):
        return lambda: np.ascontiguousarray(dequant(ck, src), dtype=np.float32)

    def stored(src):  # bf16 as stored (embeddings, lm_head, nvfp4 attention)
        def get():
            v, dt = ck.raw(src + ".weight")
            return np.ascontiguousarray(v) if dt == "BF16" else f32_to_bf16(dequant(ck, src))
        return get

    def add(gname, shape, ttype, fn):
        plan.append((gname, shape, ttype, fn))

    def qshape(rows, cols, ttype, lead=()):
        bs, ts = gguf.GGML_QUANT_SIZES[ttype]
        return tuple(lead) + (rows, cols // bs * ts)

    BF = gguf.GGMLQuantizationType.BF16
    F32 = gguf.GGMLQuantizationType.F32
    add(name[T.TOKEN_EMBD] + ".weight", (c["vocab_size"], 2 * H), BF, stored("model.embed_tokens"))
    for l in range(L):
        p = f"model.layers.{l}."
        b = lambda t: name[t].format(bid=l)
        add(b(T.ATTN_NORM) + ".weight", (H,), F32, f32(p + "input_layernorm"))
        for t, hf, rows in ((T.ATTN_Q, "q_proj", nh * hd), (T.ATTN_K, "k_proj", nkv * hd), (T.ATTN_V, "v_proj", nkv * hd),
                            (T.ATTN_OUT, "o_proj", H)):
            src = p + "self_attn." + hf
            cols = nh * hd if hf == "o_proj" else H
            _, dt = ck.raw(src + ".weight")
            tt = BF if (dt == "BF16" or a.type == "bf16") else (gguf.GGMLQuantizationType.Q8_0 if a.type != "q4_0"
                                                                  else gguf.GGMLQuantizationType.Q4_0)
            if tt == BF:
                add(b(t) + ".weight", (rows, 2 * cols), BF, stored(src))
            else:
                add(b(t) + ".weight", qshape(rows, cols, tt), tt,
                    (lambda s, q: (lambda: encode(dequant(ck, s), q)[0]))(src, tt))
        add(b(T.ATTN_Q_NORM) + ".weight", (nh * hd,), F32, f32(p + "self_attn.q_norm"))
        add(b(T.ATTN_K_NORM) + ".weight", (nkv * hd,), F32, f32(p + "self_attn.k_norm"))
        add(b(T.FFN_NORM) + ".weight", (H,), F32, f32(p + "post_attention_layernorm"))
        add(b(T.FFN_GATE_INP) + ".weight", (E, H), F32, f32(p + "block_sparse_moe.gate"))
        bias = p + "block_sparse_moe.e_score_correction_bias"
        add(b(T.FFN_EXP_PROBS_B) + ".bias", (E,), F32,
            (lambda s: (lambda: np.ascontiguousarray(ck.raw(s)[0], dtype=np.float32)))(bias))
        for t, wn, rows, cols in ((T.FFN_GATE_EXP, "w1", I, H), (T.FFN_DOWN_EXP, "w2", H, I), (T.FFN_UP_EXP, "w3", I, H)):
            def experts(wn=wn, rows=rows, cols=cols, l=l):
                out = np.empty(qshape(rows, cols, qt, (E,)) if qt != BF else (E, rows, 2 * cols), dtype=np.uint8)
                for e in range(E):
                    src = f"model.layers.{l}.block_sparse_moe.experts.{e}.{wn}"
                    if qt == gguf.GGMLQuantizationType.NVFP4:
                        out[e] = nvfp4_repack(ck, src)
                    else:
                        out[e] = encode(dequant(ck, src), qt)[0].view(np.uint8).reshape(out[e].shape)
                return out
            add(b(t) + ".weight", qshape(rows, cols, qt, (E,)) if qt != BF else (E, rows, 2 * cols), qt, experts)
    add(name[T.OUTPUT_NORM] + ".weight", (H,), F32, f32("model.norm"))
    add(name[T.OUTPUT] + ".weight", (c["vocab_size"], 2 * H), BF, stored("lm_head"))

    for gname, shape, ttype, _ in plan:
        nbytes = int(np.prod(shape)) * (4 if ttype == F32 else 1)
        dt = np.float32 if ttype == F32 else np.uint8
        w.add_tensor_info(gname, shape, np.dtype(dt), nbytes, raw_dtype=None if ttype == F32 else ttype)
    try:
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        for i, (gname, shape, ttype, fn) in enumerate(plan):
            arr = fn()
            arr = np.ascontiguousarray(arr).view(np.float32 if ttype == F32 else np.uint8).reshape(shape)
            w.write_tensor_data(arr)
            if arr.nbytes > (64 << 20):
                print(f"gguf_convert: {gname} {gguf.GGMLQuantizationType(ttype).name} {arr.nbytes / 1e9:.2f} GB "
                      f"({i + 1}/{len(plan)})", flush=True)
        w.close()
        os.replace(tmp, a.out)
    except BaseException:
        w.close()
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    print(f"gguf_convert: wrote {a.out} ({os.path.getsize(a.out) / 1e9:.2f} GB, {a.type})")


if __name__ == "__main__":
    main()
