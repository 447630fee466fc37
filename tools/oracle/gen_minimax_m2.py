#!/usr/bin/env python3
"""gen_minimax_m2.py — independent oracle for moerun's MiniMax-M2 forward pass.

Owns: tests/data/model/tiny/ (a tiny bf16 MiniMax-M2 checkpoint with HF names)
and tests/data/model/tiny/golden.bin (logits computed by Hugging Face
transformers' MiniMaxM2ForCausalLM, torch CPU, fp32 arithmetic).

The checkpoint is created here, with a fixed seed, rather than read from
`moerun gen-tiny`, so that the oracle does not depend on moerun at all; the
C test (tests/test_model.c) loads the very same files through moerun's loader.

Checks made here, reported on stdout (and asserted):
  * partial RoPE: the config's `rotary_dim` becomes partial_rotary_factor and
    the rotary embedding has rotary_dim/2 frequencies, dims >= rotary_dim pass
    through unchanged (an old transformers release rotated all head dims);
  * QK-norm: q_norm/k_norm weights span the whole q / k vector (Hq*D, Hkv*D);
  * router: sigmoid scores + e_score_correction_bias for selection, weights
    renormalized from the unbiased sigmoid scores.

golden.bin layout (little-endian):
  char  magic[8] = "MRGOLD1\\0"
  i32   n_prompts, vocab, steps
  per prompt:
    i32 L                          prompt length
    i32 ids[L]                     prompt ids
    i32 gen[steps + 1]             greedy tokens: gen[0] from the prefill, gen[j] from decode step j
    f32 logits[L + steps][vocab]   rows 0..L-1: prefill positions, row L+j-1: decode step j (input gen[j-1])

The model runs in fp32 (bf16 weights widened exactly), attention "eager".
Usage: python3 tools/oracle/gen_minimax_m2.py [--out tests/data/model/tiny]

With --kv-fp8 it writes golden_kv_fp8_e4m3.bin and golden_kv_fp8_e5m2.bin
beside the checkpoint (read, not regenerated; same layout as golden.bin): the
same prompts with K and V kept as an FP8 KV cache keeps them (--kv-cache-dtype
fp8_e4m3 / fp8_e5m2 in vLLM and sglang, scale 1): every K and V row clamped to
the type's largest finite value and cast by torch to float8_e4m3fn /
float8_e5m2 (round to nearest even) before attention reads it, the current
token's own row too. It asserts that these logits differ from the fp32 cache's
by far more than the C test's tolerance, so that the test tells the two apart.
golden_kv_fp8_e4m3_scaled.bin: the same with per-layer scales as a checkpoint
carries them (KV_SCALES; vLLM's semantics: stored = cast(clamp(x / scale)),
read = stored * scale); the C test adds the same values to a copy of the
checkpoint as k_scale / v_scale tensors.

With --dense-bf16 it writes golden_dense_bf16.bin beside the checkpoint (same
layout): the inputs of q_proj, k_proj, v_proj, o_proj and lm_head rounded to
bf16 (round to nearest even) before each fp32 matmul, moerun's
--dense-activation-dtype bf16. It first checks that this transformers
reproduces golden.bin, and that the rounding moves the logits by more than the
C test can tell apart.
"""
import argparse
import json
import os
import struct

import numpy as np
import torch
from safetensors.torch import save_file

# Small enough to commit (< 0.5 MB), large enough to exercise GQA (2 q heads
# per kv head), partial RoPE (8 of 16 dims), top-2 of 8 experts with a bias
# that changes selections, and two layers.
CFG = dict(
    vocab=256, hidden=64, layers=2, heads=4, kv_heads=2, head_dim=16, rotary_dim=8,
    experts=8, top_k=2, inter=32, rope_theta=10000.0, eps=1e-6,
)
# (k_scale, v_scale) per layer for golden_kv_fp8_e4m3_scaled.bin; tests/test_model.c holds the same values.
# Layer 0's k_scale is small enough that some K values saturate at +-448.
KV_SCALES = [(0.004, 0.01), (0.02, 0.002)]
PROMPTS = [[1, 17, 42, 99, 3], [200, 5, 5, 7, 250, 128, 64, 11, 13], [77, 31, 9]]
STEPS = 16
SEED = 20240501


def make_config(c):
    return {
        "architectures": ["MiniMaxM2ForCausalLM"],
        "model_type": "minimax_m2",
        "vocab_size": c["vocab"],
        "hidden_size": c["hidden"],
        "intermediate_size": c["inter"],
        "num_hidden_layers": c["layers"],
        "num_attention_heads": c["heads"],
        "num_key_value_heads": c["kv_heads"],
        "head_dim": c["head_dim"],
        "rotary_dim": c["rotary_dim"],
        "rope_theta": c["rope_theta"],
        "rms_norm_eps": c["eps"],
        "num_local_experts": c["experts"],
        "num_experts_per_tok": c["top_k"],
        "scoring_func": "sigmoid",
        "use_routing_bias": True,
        "use_qk_norm": True,
        "qk_norm_type": "per_layer",
        "shared_intermediate_size": 0,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "max_position_embeddings": 4096,
        "attn_type_list": [1] * c["layers"],
        "use_mtp": True,
        "num_mtp_modules": 1,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "torch_dtype": "bfloat16",
    }


def make_weights(c, rng):
    H, V, D = c["hidden"], c["vocab"], c["head_dim"]
    qd, kd = c["heads"] * D, c["kv_heads"] * D
    E, I = c["experts"], c["inter"]

    def lin(n, k):
        return rng.standard_normal((n, k), dtype=np.float32) / np.sqrt(k)

    def norm(n):
        return 1.0 + 0.2 * rng.standard_normal(n, dtype=np.float32)

    w = {"model.embed_tokens.weight": rng.standard_normal((V, H), dtype=np.float32)}
    # layers 0..L-1, plus one MTP-style layer numbered L that loaders must skip
    for L in range(c["layers"] + 1):
        p = f"model.layers.{L}."
        w[p + "input_layernorm.weight"] = norm(H)
        w[p + "post_attention_layernorm.weight"] = norm(H)
        w[p + "self_attn.q_proj.weight"] = lin(qd, H)
        w[p + "self_attn.k_proj.weight"] = lin(kd, H)
        w[p + "self_attn.v_proj.weight"] = lin(kd, H)
        w[p + "self_attn.o_proj.weight"] = lin(H, qd)
        w[p + "self_attn.q_norm.weight"] = norm(qd)
        w[p + "self_attn.k_norm.weight"] = norm(kd)
        w[p + "block_sparse_moe.gate.weight"] = lin(E, H) * 2.0
        w[p + "block_sparse_moe.e_score_correction_bias"] = 0.15 * rng.standard_normal(E, dtype=np.float32)
        for x in range(E):
            w[p + f"block_sparse_moe.experts.{x}.w1.weight"] = lin(I, H)
            w[p + f"block_sparse_moe.experts.{x}.w3.weight"] = lin(I, H)
            w[p + f"block_sparse_moe.experts.{x}.w2.weight"] = lin(H, I)
    w["model.norm.weight"] = norm(H)
    w["lm_head.weight"] = lin(V, H) * 2.0
    out = {}
    for k, v in w.items():
        t = torch.from_numpy(np.ascontiguousarray(v))
        # the correction bias stays fp32 (spec/minimax-m2.md); everything else bf16
        out[k] = t if k.endswith("e_score_correction_bias") else t.to(torch.bfloat16)
    return out


def check_transformers(model, c):
    from transformers.models.minimax_m2 import modeling_minimax_m2 as mm

    inv = model.model.rotary_emb.inv_freq
    assert inv.numel() == c["rotary_dim"] // 2, f"rotary freqs {inv.numel()} != rotary_dim/2"
    exp = 1.0 / (c["rope_theta"] ** (torch.arange(0, c["rotary_dim"], 2, dtype=torch.float32) / c["rotary_dim"]))
    assert torch.allclose(inv, exp), "inv_freq differs from 1/theta^(2i/rotary_dim)"
    q = torch.randn(1, c["heads"], 3, c["head_dim"])
    pos = torch.arange(3)[None]
    cos, sin = model.model.rotary_emb(q, pos)
    q2, _ = mm.apply_rotary_pos_emb(q, q[:, : c["kv_heads"]], cos, sin)
    assert torch.equal(q2[..., c["rotary_dim"]:], q[..., c["rotary_dim"]:]), "dims past rotary_dim were rotated"
    assert not torch.allclose(q2[..., 1:, : c["rotary_dim"]], q[..., 1:, : c["rotary_dim"]])
    a = model.model.layers[0].self_attn
    assert a.q_norm.weight.numel() == c["heads"] * c["head_dim"], "q_norm is not over the whole q vector"
    assert a.k_norm.weight.numel() == c["kv_heads"] * c["head_dim"], "k_norm is not over the whole k vector"
    print("transformers checks: partial RoPE on %d of %d dims OK; QK-norm over whole q (%d) and k (%d) OK"
          % (c["rotary_dim"], c["head_dim"], a.q_norm.weight.numel(), a.k_norm.weight.numel()))
    # router: compare HF's gate against the spec formula on random inputs
    moe = model.model.layers[0].mlp
    x = torch.randn(5, c["hidden"])
    logits, w_hf, ids_hf = moe.gate(x, moe.e_score_correction_bias)
    s = torch.sigmoid(x @ moe.gate.weight.T)
    key = s + moe.e_score_correction_bias
    ids = torch.topk(key, c["top_k"], dim=-1).indices
    wsel = s.gather(1, ids)
    wsel = wsel / (wsel.sum(-1, keepdim=True) + 1e-20)
    order = torch.argsort(ids_hf, dim=-1)
    order2 = torch.argsort(ids, dim=-1)
    assert torch.equal(ids_hf.gather(1, order), ids.gather(1, order2)), "router selection differs from spec"
    assert torch.allclose(w_hf.gather(1, order), wsel.gather(1, order2), atol=1e-6), "router weights differ"
    print("transformers checks: router = sigmoid + bias for selection, unbiased renormalized weights OK")


def run_prompts(model, c, kv_round=None, full_atol=1e-4):
    """greedy decode of PROMPTS; kv_round(t) rounds every K and V row the cache stores; full_atol: how far
    the cached decode may be from one full pass"""
    from transformers import DynamicCache

    def new_cache():
        cache = DynamicCache()
        if kv_round is not None:
            upd = cache.update

            def update(k, v, layer_idx, *a, **kw):
                return upd(kv_round(k, layer_idx, 0), kv_round(v, layer_idx, 1), layer_idx, *a, **kw)

            cache.update = update
        return cache

    blob = bytearray(b"MRGOLD1\0")
    blob += struct.pack("<3i", len(PROMPTS), c["vocab"], STEPS)
    min_margin = 1e9
    all_logits = []
    with torch.no_grad():
        for ids in PROMPTS:
            cache = new_cache()
            o = model(input_ids=torch.tensor([ids]), cache=cache, use_cache=True)
            rows = [o.logits[0]]
            gen = [int(o.logits[0, -1].argmax())]
            for _ in range(STEPS):
                o = model(input_ids=torch.tensor([[gen[-1]]]), cache=cache, use_cache=True)
                rows.append(o.logits[0])
                gen.append(int(o.logits[0, -1].argmax()))
            logits = torch.cat(rows, 0)
            # the cached decode must equal one full pass over the same tokens (its cache rounded alike)
            full = model(input_ids=torch.tensor([ids + gen[:-1]]), cache=new_cache(), use_cache=True).logits[0]
            fd = float((full - logits).abs().max())
            assert fd <= full_atol, "cached decode != full pass (%.3g)" % fd
            top2 = torch.topk(logits[len(ids) - 1:], 2, dim=-1).values
            min_margin = min(min_margin, float((top2[:, 0] - top2[:, 1]).min()))
            blob += struct.pack("<i", len(ids)) + struct.pack(f"<{len(ids)}i", *ids)
            blob += struct.pack(f"<{len(gen)}i", *gen)
            blob += logits.numpy().astype("<f4").tobytes()
            all_logits.append(logits)
            print("prompt", ids, "-> greedy", gen)
    print("min top-1/top-2 logit margin over greedy steps: %.4g" % min_margin)
    assert min_margin > 1e-3, "greedy choice too close to call; change SEED"
    return bytes(blob), all_logits


def kv_fp8(out, c):
    """golden_kv_fp8_*.bin for the checkpoint already in out"""
    from transformers import MiniMaxM2ForCausalLM

    model = MiniMaxM2ForCausalLM.from_pretrained(out, dtype=torch.float32, attn_implementation="eager")
    model.eval()
    _, exact = run_prompts(model, c)
    for name, dt, top in (("fp8_e4m3", torch.float8_e4m3fn, 448.0), ("fp8_e5m2", torch.float8_e5m2, 57344.0)):
        def rnd(t, layer=0, which=0, dt=dt, top=top):
            return t.clamp(-top, top).to(dt).to(torch.float32)

        probe = torch.tensor([1.0 + 2.0 ** -4, 500.0, -1e9, 2.0 ** -12])  # a tie, saturation, a subnormal
        print(name, "cast check:", probe.tolist(), "->", rnd(probe).tolist())
        blob, lg = run_prompts(model, c, rnd)
        diff = max(float((a - b).abs().max()) for a, b in zip(lg, exact))
        print("%s: max |logit - fp32 cache's logit| = %.4g" % (name, diff))
        assert diff > 2e-2, "the FP8 cache changes the logits too little for the test to tell it from fp32"
        with open(os.path.join(out, "golden_kv_%s.bin" % name), "wb") as f:
            f.write(blob)

    def rnd_scaled(t, layer, which):
        s = KV_SCALES[layer][which]
        return (t / s).clamp(-448.0, 448.0).to(torch.float8_e4m3fn).to(torch.float32) * s

    blob, lg = run_prompts(model, c, rnd_scaled)
    diff = max(float((a - b).abs().max()) for a, b in zip(lg, exact))
    print("fp8_e4m3 with KV_SCALES: max |logit - fp32 cache's logit| = %.4g" % diff)
    assert diff > 2e-2
    with open(os.path.join(out, "golden_kv_fp8_e4m3_scaled.bin"), "wb") as f:
        f.write(blob)


def dense_bf16(out, c):
    """golden_dense_bf16.bin for the checkpoint already in out: --dense-activation-dtype bf16, the inputs
    of q/k/v_proj, o_proj and lm_head rounded to bf16 (round to nearest even, torch's cast) before the
    fp32 matmul, as an engine running these layers in bf16 sees them; everything else fp32"""
    from transformers import MiniMaxM2ForCausalLM

    model = MiniMaxM2ForCausalLM.from_pretrained(out, dtype=torch.float32, attn_implementation="eager")
    model.eval()
    # this transformers must reproduce the checked-in fp32 golden first
    blob, exact = run_prompts(model, c)
    with open(os.path.join(out, "golden.bin"), "rb") as f:
        old = f.read()
    assert len(old) == len(blob), "golden.bin has another layout"
    a = np.frombuffer(old[20:], dtype="<i4")
    b = np.frombuffer(blob[20:], dtype="<i4")
    mism = np.nonzero(a != b)[0]
    worst = 0.0
    if mism.size:  # the logits may differ in the last bits between torch builds; ids may not
        fa = np.frombuffer(old[20:], dtype="<f4")[mism]
        fb = np.frombuffer(blob[20:], dtype="<f4")[mism]
        worst = float(np.abs(fa - fb).max())
    print("fp32 golden reproduced: %d of %d words differ, by at most %.3g" % (mism.size, a.size, worst))
    assert worst < 1e-4

    def rnd(mod, args):
        return (args[0].to(torch.bfloat16).to(torch.float32),) + tuple(args[1:])

    hooks = [model.lm_head.register_forward_pre_hook(rnd)]
    for layer in model.model.layers:
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            hooks.append(getattr(layer.self_attn, name).register_forward_pre_hook(rnd))
    # a cached decode and a full pass give inputs that differ in the last fp32 bits, and where one rounds
    # to another bf16 the logits move by about 1e-3: the check of the cache gets that room
    blob, lg = run_prompts(model, c, full_atol=2e-2)
    for h in hooks:
        h.remove()
    diff = max(float((x - y).abs().max()) for x, y in zip(lg, exact))
    print("dense inputs in bf16: max |logit - fp32's logit| = %.4g" % diff)
    assert diff > 2e-3, "bf16 dense inputs change the logits too little for the test to tell them from fp32"
    with open(os.path.join(out, "golden_dense_bf16.bin"), "wb") as f:
        f.write(blob)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "..", "tests", "data", "model", "tiny"))
    ap.add_argument("--kv-fp8", action="store_true", help="write the FP8 KV cache goldens for the checkpoint in --out")
    ap.add_argument("--dense-bf16", action="store_true",
                    help="write golden_dense_bf16.bin (bf16 inputs of the dense projections) for the checkpoint in --out")
    args = ap.parse_args()
    out = os.path.abspath(args.out)
    if args.kv_fp8:
        kv_fp8(out, CFG)
        return
    if args.dense_bf16:
        dense_bf16(out, CFG)
        return
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(SEED)
    rng = np.random.default_rng(SEED)
    c = CFG
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(make_config(c), f, indent=2)
        f.write("\n")
    with open(os.path.join(out, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": 1, "eos_token_id": [2, 3]}, f, indent=2)
        f.write("\n")
    save_file(make_weights(c, rng), os.path.join(out, "model.safetensors"), metadata={"format": "pt"})

    from transformers import MiniMaxM2ForCausalLM

    model, info = MiniMaxM2ForCausalLM.from_pretrained(
        out, dtype=torch.float32, attn_implementation="eager", output_loading_info=True)
    model.eval()
    assert not info["missing_keys"], info["missing_keys"]
    check_transformers(model, c)

    blob, _ = run_prompts(model, c)
    with open(os.path.join(out, "golden.bin"), "wb") as f:
        f.write(blob)


if __name__ == "__main__":
    main()
