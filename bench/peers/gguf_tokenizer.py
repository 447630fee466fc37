#!/usr/bin/env python3
"""gguf_tokenizer.py — gives a GGUF file (bench/peers/gguf_convert.py writes
them with llama.cpp's "none" vocabulary: token ids only) the byte-level BPE
tokenizer of a moerun model folder (tokenizer.json), so that llama.cpp's
servers take text prompts, as the serving benchmark sends them to both.

    python gguf_tokenizer.py IN.gguf MODEL_DIR OUT.gguf

Writes tokenizer.ggml.{model = gpt2, pre = gpt-4o (MiniMax-M2's split regex
is GPT-4o's: shared/spec/text.md), tokens (the vocabulary's strings by id,
the model's padding ids as unused tokens), token_type, merges, bos/eos}. The
tensors and other metadata are copied as they are (gguf's own
copy_with_new_metadata). Needs numpy and the `gguf` package. Written to
OUT.tmp and renamed when complete.
"""
import json
import os
import sys

import gguf
from gguf.scripts.gguf_new_metadata import MetadataDetails, copy_with_new_metadata

T = gguf.GGUFValueType


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    src, model_dir, out = sys.argv[1:]
    tok = json.load(open(os.path.join(model_dir, "tokenizer.json"), encoding="utf-8"))
    cfg = json.load(open(os.path.join(model_dir, "config.json"), encoding="utf-8"))
    tcfg_path = os.path.join(model_dir, "tokenizer_config.json")
    tcfg = json.load(open(tcfg_path, encoding="utf-8")) if os.path.exists(tcfg_path) else {}
    m = tok["model"]
    if m.get("type") != "BPE":
        sys.exit(f"gguf_tokenizer: {model_dir}: a {m.get('type')} model, not byte-level BPE")
    n = int(cfg["vocab_size"])
    tokens = [f"[PAD{i}]" for i in range(n)]
    types = [gguf.TokenType.UNUSED] * n
    for s, i in m["vocab"].items():
        tokens[i] = s
        types[i] = gguf.TokenType.NORMAL
    ids = {}
    for a in tok.get("added_tokens", []):
        tokens[a["id"]] = a["content"]
        types[a["id"]] = gguf.TokenType.CONTROL if a.get("special") else gguf.TokenType.USER_DEFINED
        ids[a["content"]] = a["id"]
    merges = [x if isinstance(x, str) else " ".join(x) for x in m["merges"]]

    def special(key):
        v = tcfg.get(key)
        v = v.get("content") if isinstance(v, dict) else v
        return ids.get(v) if v else None

    meta = {
        gguf.Keys.Tokenizer.MODEL: MetadataDetails(T.STRING, "gpt2"),
        gguf.Keys.Tokenizer.PRE: MetadataDetails(T.STRING, "gpt-4o"),
        gguf.Keys.Tokenizer.LIST: MetadataDetails(T.ARRAY, tokens, sub_type=T.STRING),
        gguf.Keys.Tokenizer.TOKEN_TYPE: MetadataDetails(T.ARRAY, [int(t) for t in types], sub_type=T.INT32),
        gguf.Keys.Tokenizer.MERGES: MetadataDetails(T.ARRAY, merges, sub_type=T.STRING),
        gguf.Keys.Tokenizer.ADD_BOS: MetadataDetails(T.BOOL, bool(tcfg.get("add_bos_token", False))),
    }
    for key, name in ((gguf.Keys.Tokenizer.BOS_ID, "bos_token"), (gguf.Keys.Tokenizer.EOS_ID, "eos_token")):
        i = special(name)
        if i is not None:
            meta[key] = MetadataDetails(T.UINT32, i)
    reader = gguf.GGUFReader(src, "r")
    arch = reader.get_field(gguf.Keys.General.ARCHITECTURE).contents()
    tmp = out + ".tmp"
    writer = gguf.GGUFWriter(tmp, arch=arch, endianess=reader.endianess)
    copy_with_new_metadata(reader, writer, meta, [])
    os.replace(tmp, out)
    print(f"gguf_tokenizer: wrote {out} ({n} tokens, {len(merges)} merges)")


if __name__ == "__main__":
    main()
