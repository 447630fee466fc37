#!/usr/bin/env python3
"""tokenizer.py — moerun's tokenizer against huggingface/tokenizers, side by
side in one process, one thread each, on the same text.

Both load the same tokenizer.json; each round encodes the text once
(document by document, or --unit all: as one string) with HF (`Tokenizer.encode`, the Rust library through its Python binding)
and once with moerun (`mr_tokenizer_encode` through ctypes on
build/libmoerun.so), interleaved, after one warm-up round of each (both keep
a per-piece cache). Prints MB/s per round, the ratio moerun / HF per round
and its range, and checks that the ids are equal.

Text: the English fortune files of the Debian package `fortunes`
(/usr/share/games/fortunes, ~2.5 MB), or --text FILE.

    apt-get install fortunes && pip install tokenizers
    make build && python3 bench/tokenizer.py [--model tests/data/text/minimax] [--rounds 7]

Needs Python (peer benchmark); the build and the tests do not.
"""
import argparse
import ctypes
import os
import statistics
import sys
import time

os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"
import tokenizers  # noqa: E402


class TokIds(ctypes.Structure):
    _fields_ = [("ids", ctypes.POINTER(ctypes.c_int32)), ("n", ctypes.c_size_t), ("cap", ctypes.c_size_t)]


def fortunes_docs():
    d = "/usr/share/games/fortunes"
    if not os.path.isdir(d):
        sys.exit("bench/tokenizer.py: no text: apt-get install fortunes, or pass --text FILE")
    parts = []
    for name in sorted(os.listdir(d)):
        p = os.path.join(d, name)
        if "." in name or os.path.islink(p) or not os.path.isfile(p):
            continue
        with open(p, encoding="utf-8", errors="replace") as f:
            parts += [t + "\n" for t in f.read().split("\n%\n")]
    return parts


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="tests/data/text/minimax")
    ap.add_argument("--lib", default="build/libmoerun.so")
    ap.add_argument("--text", help="a UTF-8 text file (default: the fortunes corpus)")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--no-special", action="store_true", help="encode without BOS/EOS")
    ap.add_argument("--unit", choices=["doc", "all"], default="doc",
                    help="doc: one encode per document (fortune, or line group of --text); all: the whole text at once")
    a = ap.parse_args()

    if a.text:
        with open(a.text, encoding="utf-8") as f:
            raw = f.read()
        docs = [raw[i:i + 2000] for i in range(0, len(raw), 2000)]
    else:
        docs = fortunes_docs()
    if a.unit == "all":
        docs = ["".join(docs)]
    datas = [d.encode("utf-8") for d in docs]
    mb = sum(map(len, datas)) / 1e6

    lib = ctypes.CDLL(os.path.abspath(a.lib))
    lib.mr_tokenizer_load.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p)]
    lib.mr_tokenizer_encode.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_uint,
                                        ctypes.POINTER(TokIds), ctypes.c_void_p]
    lib.mr_tokenizer_describe.restype = ctypes.c_char_p
    lib.mr_tokenizer_describe.argtypes = [ctypes.c_void_p]
    lib.mr_error_last.restype = ctypes.c_char_p
    lib.mr_tok_ids_free.argtypes = [ctypes.POINTER(TokIds)]
    lib.mr_version.restype = ctypes.c_char_p
    tok = ctypes.c_void_p()
    if lib.mr_tokenizer_load(a.model.encode(), ctypes.byref(tok)) != 0:
        sys.exit("moerun load: " + lib.mr_error_last().decode())
    hf = tokenizers.Tokenizer.from_file(os.path.join(a.model, "tokenizer.json") if os.path.isdir(a.model) else a.model)
    add = not a.no_special
    flags = 0 if a.no_special else 1

    enc = hf.encode
    mr_enc = lib.mr_tokenizer_encode

    def run_hf():
        t0 = time.perf_counter()
        out = [enc(d, add_special_tokens=add) for d in docs]
        dt = time.perf_counter() - t0
        return dt, [x for e in out for x in e.ids]

    def run_mr():
        v = TokIds()  # appended to: the ids of all documents, one buffer
        ref = ctypes.byref(v)
        t0 = time.perf_counter()
        for d in datas:
            if mr_enc(tok, d, len(d), flags, ref, None) != 0:
                sys.exit("moerun encode: " + lib.mr_error_last().decode())
        dt = time.perf_counter() - t0
        ids = v.ids[:v.n]
        lib.mr_tok_ids_free(ref)
        return dt, ids

    _, ids_hf = run_hf()  # warm-up: both fill their caches
    _, ids_mr = run_mr()
    if ids_hf != ids_mr:
        k = next((i for i, (x, y) in enumerate(zip(ids_hf, ids_mr)) if x != y), min(len(ids_hf), len(ids_mr)))
        sys.exit(f"ids differ at {k}: HF {len(ids_hf)} ids, moerun {len(ids_mr)}")

    print(f"tokenizer: {a.model}: {lib.mr_tokenizer_describe(tok).decode()}")
    print(f"text: {mb:.2f} MB in {len(docs)} encode calls ({a.unit}), {len(ids_hf)} tokens "
          f"({mb * 1e6 / len(ids_hf):.2f} bytes/token); ids equal")
    print(f"peer: huggingface tokenizers {tokenizers.__version__} (Tokenizer.encode, RAYON_NUM_THREADS=1); "
          f"moerun {lib.mr_version().decode()} (mr_tokenizer_encode); one thread each, interleaved")
    ratios, mr_rates, hf_rates = [], [], []
    for r in range(a.rounds):
        order = (run_hf, run_mr) if r % 2 == 0 else (run_mr, run_hf)
        res = {}
        for fn in order:
            res[fn] = fn()[0]
        hf_rate, mr_rate = mb / res[run_hf], mb / res[run_mr]
        hf_rates.append(hf_rate)
        mr_rates.append(mr_rate)
        ratios.append(mr_rate / hf_rate)
        print(f"  round {r + 1}: HF {hf_rate:7.2f} MB/s   moerun {mr_rate:7.2f} MB/s   ratio {mr_rate / hf_rate:5.2f}x")
    print(f"HF {min(hf_rates):.1f}-{max(hf_rates):.1f} MB/s, moerun {min(mr_rates):.1f}-{max(mr_rates):.1f} MB/s; "
          f"ratio moerun/HF median {statistics.median(ratios):.2f}x (range {min(ratios):.2f}-{max(ratios):.2f}x, "
          f"target >= 1x)")


if __name__ == "__main__":
    main()
