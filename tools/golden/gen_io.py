#!/usr/bin/env python3
"""gen_io.py — golden data for the io/ tests (safetensors reader, index, writer).

Writes, with the reference implementation (the `safetensors` Python package,
backed by huggingface/safetensors' Rust code) and torch:

  tests/data/io/ckpt/                       a small HF-style sharded checkpoint
      model-00001-of-00002.safetensors      (BF16, F8_E4M3, U8 and F32 tensors,
      model-00002-of-00002.safetensors       a scalar and an empty tensor)
      model.safetensors.index.json
  tests/data/io/ckpt_golden.json            what safetensors reports for it:
      per tensor name, dtype, shape, bytes, file and sha256 of the data; per
      file the tensor names in header (= data) order and the file's sha256
  tests/data/io/ckpt_listing.txt            one line per tensor, "name dtype
      [shape] bytes file", as `moerun inspect` prints it (whitespace aside)
  tests/fuzz/corpus/safetensors/*           seed corpus: small valid and
      invalid files for the libFuzzer target
  tests/data/io/corpus_verdicts.json        whether the reference reader
      accepts each seed (and how many tensors it sees); test_io compares

Deterministic (fixed seeds, numpy PCG64). Run from the repository root:
    python3 tools/golden/gen_io.py
The C build and tests never need Python; the outputs are committed.
"""
import hashlib
import json
import os
import struct
import sys

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import save, save_file

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
OUT = os.path.join(ROOT, "tests", "data", "io")
CKPT = os.path.join(OUT, "ckpt")
CORPUS = os.path.join(ROOT, "tests", "fuzz", "corpus", "safetensors")

SHARD1 = "model-00001-of-00002.safetensors"
SHARD2 = "model-00002-of-00002.safetensors"


def make_tensors():
    rng = np.random.default_rng(20240601)

    def randn(*shape):
        return torch.from_numpy(rng.standard_normal(shape, dtype=np.float32))

    def u8(*shape):
        return torch.from_numpy(rng.integers(0, 256, size=shape, dtype=np.uint8))

    e = "model.layers.0.block_sparse_moe"
    shard1 = {
        "model.embed_tokens.weight": randn(64, 32).to(torch.bfloat16),
        f"{e}.experts.0.w1.weight": (randn(64, 32) * 64).to(torch.float8_e4m3fn),
        f"{e}.experts.0.w1.weight_scale_inv": randn(1, 1).abs(),
        f"{e}.gate.weight": randn(8, 32).to(torch.bfloat16),
        f"{e}.e_score_correction_bias": randn(8),
        "model.layers.0.input_layernorm.weight": (1 + 0.1 * randn(32)).to(torch.bfloat16),
    }
    shard2 = {
        f"{e}.experts.1.w1.weight": u8(64, 16),
        f"{e}.experts.1.w1.weight_scale": (randn(64, 2).abs() * 8).to(torch.float8_e4m3fn),
        f"{e}.experts.1.w1.weight_scale_2": torch.tensor(0.0123, dtype=torch.float32),
        f"{e}.experts.1.w1.empty": torch.zeros(0, 4, dtype=torch.float32),
        "model.norm.weight": (1 + 0.1 * randn(32)),
        "lm_head.weight": randn(64, 32).to(torch.bfloat16),
    }
    return shard1, shard2


def raw_bytes(t):
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def header_order(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        h = json.loads(f.read(n))
    return [k for k in h if k != "__metadata__"]  # json keeps file order


def write_ckpt():
    os.makedirs(CKPT, exist_ok=True)
    s1, s2 = make_tensors()
    save_file(s1, os.path.join(CKPT, SHARD1), metadata={"format": "pt"})
    save_file(s2, os.path.join(CKPT, SHARD2), metadata={"format": "pt"})
    for fname in (SHARD1, SHARD2):
        os.chmod(os.path.join(CKPT, fname), 0o644)
    weight_map = {k: SHARD1 for k in s1}
    weight_map.update({k: SHARD2 for k in s2})
    total = sum(t.numel() * t.element_size() for t in list(s1.values()) + list(s2.values()))
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    with open(os.path.join(CKPT, "model.safetensors.index.json"), "w") as f:
        json.dump(index, f, indent=2, sort_keys=True)
        f.write("\n")

    # the listing, as the reference reader reports it, following the index
    tensors = []
    for name, fname in sorted(weight_map.items()):
        with safe_open(os.path.join(CKPT, fname), framework="pt") as f:
            sl = f.get_slice(name)
            t = f.get_tensor(name)
            data = raw_bytes(t)
            tensors.append({
                "name": name,
                "dtype": sl.get_dtype(),
                "shape": list(sl.get_shape()),
                "bytes": len(data),
                "file": fname,
                "sha256": hashlib.sha256(data).hexdigest(),
            })
    files = []
    for fname in (SHARD1, SHARD2):
        p = os.path.join(CKPT, fname)
        with safe_open(p, framework="pt") as f:
            meta = f.metadata()
        with open(p, "rb") as fh:
            blob = fh.read()
        files.append({
            "name": fname,
            "size": len(blob),
            "header_size": struct.unpack("<Q", blob[:8])[0],
            "metadata": meta,
            "order": header_order(p),
            "sha256": hashlib.sha256(blob).hexdigest(),
        })
    golden = {
        "generator": "tools/golden/gen_io.py with safetensors %s, torch %s" % (
            __import__("safetensors").__version__, torch.__version__),
        "files": files,
        "tensors": tensors,
    }
    with open(os.path.join(OUT, "ckpt_golden.json"), "w") as f:
        json.dump(golden, f, indent=1)
        f.write("\n")
    with open(os.path.join(OUT, "ckpt_listing.txt"), "w") as f:
        for t in tensors:
            shape = "[" + ", ".join(str(d) for d in t["shape"]) + "]"
            f.write(f'{t["name"]} {t["dtype"]} {shape} {t["bytes"]} {t["file"]}\n')


def st_raw(header, data=b"", pad=True):
    """A file from an explicit header (str or bytes), for invalid seeds."""
    h = header.encode() if isinstance(header, str) else header
    if pad:
        h += b" " * ((8 - len(h) % 8) % 8)
    return struct.pack("<Q", len(h)) + h + data


def write_corpus():
    os.makedirs(CORPUS, exist_ok=True)
    for f in os.listdir(CORPUS):
        os.remove(os.path.join(CORPUS, f))
    seeds = {
        "valid_small": save({"a": torch.arange(6, dtype=torch.float32).reshape(2, 3),
                             "b": torch.ones(4, dtype=torch.bfloat16),
                             "c": torch.zeros(3, dtype=torch.uint8)}, metadata={"format": "pt"}),
        "valid_f8_scalar": save({"w": torch.ones(2, 2).to(torch.float8_e4m3fn),
                                 "s": torch.tensor(1.5)}),
        "valid_empty": st_raw("{}"),
        "valid_zero_dim": st_raw('{"e":{"dtype":"F32","shape":[0,4],"data_offsets":[0,0]},'
                                 '"u":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}', b"\1\2"),
        "valid_f4_f6": st_raw('{"a":{"dtype":"F4","shape":[4],"data_offsets":[0,2]},'
                              '"b":{"dtype":"F6_E2M3","shape":[4],"data_offsets":[2,5]}}', b"\0" * 5),
        "bad_too_small": b"\x08\0\0",
        "bad_too_large": struct.pack("<Q", 100000001) + b"{}",
        "bad_header_len": struct.pack("<Q", 64) + b"{}      ",
        "bad_not_object": st_raw("[1, 2]"),
        "bad_utf8": st_raw(b'{"\xff":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', b"\0"),
        "bad_gap": st_raw('{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},'
                          '"b":{"dtype":"U8","shape":[1],"data_offsets":[2,3]}}', b"\0" * 3),
        "bad_overflow": st_raw('{"a":{"dtype":"F32","shape":[1099511627776,1099511627776],"data_offsets":[0,4]}}',
                               b"\0" * 4),
        "bad_trailing": st_raw('{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', b"\0\0"),
        "bad_dtype": st_raw('{"a":{"dtype":"F8_E4M3FNUZ","shape":[1],"data_offsets":[0,1]}}', b"\0"),
        "bad_meta": st_raw('{"__metadata__":{"k":1}}'),
        "bad_dup": st_raw('{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},'
                          '"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', b"\0"),
        "valid_ws_unknown_key": st_raw('\n {"__metadata__":null,"a":{"zz":[1],"dtype":"I16","shape":[2],'
                                       '"data_offsets":[0,4]}}\t', b"\0" * 4),
        "bad_huge_dim": st_raw('{"a":{"dtype":"U8","shape":[9223372036854775813,0],"data_offsets":[0,0]}}'),
        "bad_end_lt_begin": st_raw('{"a":{"dtype":"U8","shape":[0],"data_offsets":[0,0]},'
                                   '"b":{"dtype":"U8","shape":[0],"data_offsets":[0,0]},'
                                   '"c":{"dtype":"U8","shape":[0],"data_offsets":[1,0]}}'),
        "bad_f4_odd": st_raw('{"a":{"dtype":"F4","shape":[3],"data_offsets":[0,2]}}', b"\0\0"),
        "bad_size": st_raw('{"a":{"dtype":"BF16","shape":[2,3],"data_offsets":[0,10]}}', b"\0" * 10),
        "bad_truncated": st_raw('{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}', b"\0" * 12),
        "bad_float_shape": st_raw('{"a":{"dtype":"U8","shape":[1.0],"data_offsets":[0,1]}}', b"\0"),
        "bad_offsets_3": st_raw('{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1,1]}}', b"\0"),
        "bad_first_not_0": st_raw('{"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}', b"\0\0"),
        "bad_unknown_dtype": st_raw('{"a":{"dtype":"F12","shape":[1],"data_offsets":[0,1]}}', b"\0"),
        "bad_json": st_raw('{"a":'),
        "bad_header_nul": st_raw('{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}\0', b"\0"),
    }
    verdicts = {}
    for name, blob in sorted(seeds.items()):
        path = os.path.join(CORPUS, name)
        with open(path, "wb") as f:
            f.write(blob)
        try:
            with safe_open(path, framework="np") as f:
                verdicts[name] = {"ok": True, "tensors": len(list(f.keys()))}
        except Exception as e:  # the reference reader's verdict, whatever it is
            verdicts[name] = {"ok": False, "error": str(e)[:200]}
    with open(os.path.join(OUT, "corpus_verdicts.json"), "w") as f:
        json.dump({"reader": "safetensors %s (Python; Rust core)" % __import__("safetensors").__version__,
                   "verdicts": verdicts}, f, indent=1)
        f.write("\n")


def main():
    write_ckpt()
    write_corpus()
    print("wrote", CKPT, "and", CORPUS, file=sys.stderr)


if __name__ == "__main__":
    main()
