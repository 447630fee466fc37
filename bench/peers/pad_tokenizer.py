#!/usr/bin/env python3
"""pad_tokenizer.py — makes a model folder for the serving comparison:
MODEL_DIR's config and weights (linked, not copied) with the byte-level BPE
tokenizer of TOK_DIR, where every id of MODEL_DIR's vocabulary that the
tokenizer leaves without a token gets one ("<tN>", reachable by no merge:
it is only ever generated). A random-weight checkpoint generates such ids
as often as any; with a text for each, every generated token is one
streamed event with text on every server, so that a client counting
events counts tokens. bos/eos become the tokenizer's.

    python3 pad_tokenizer.py MODEL_DIR TOK_DIR OUT_DIR

Written to OUT_DIR.tmp and renamed when complete; an existing OUT_DIR is kept.
"""
import json
import os
import shutil
import sys


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    src, tok_dir, out = sys.argv[1:]
    if os.path.isdir(out):
        print(f"pad_tokenizer: {out} exists, kept")
        return
    tmp = out + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    cfg = json.load(open(os.path.join(src, "config.json")))
    tok = json.load(open(os.path.join(tok_dir, "tokenizer.json"), encoding="utf-8"))
    gen = json.load(open(os.path.join(tok_dir, "generation_config.json")))
    n = int(cfg["vocab_size"])
    vocab = tok["model"]["vocab"]
    used = set(vocab.values()) | {a["id"] for a in tok.get("added_tokens", [])}
    if max(used) >= n:
        sys.exit(f"pad_tokenizer: the tokenizer has ids up to {max(used)}, above the model's vocabulary of {n}")
    strs = set(vocab) | {a["content"] for a in tok.get("added_tokens", [])}
    # the added tokens in the vocabulary at their ids: tokenizers gives an added
    # token that the vocabulary lacks the next id after the vocabulary's size,
    # which the padding has just moved
    for a in tok.get("added_tokens", []):
        vocab.setdefault(a["content"], a["id"])
    for i in range(n):
        if i not in used:
            s = f"<t{i}>"
            if s in strs:
                sys.exit(f"pad_tokenizer: {s} is already a token")
            vocab[s] = i
    eos = gen["eos_token_id"]
    cfg["bos_token_id"] = gen["bos_token_id"]
    cfg["eos_token_id"] = eos[0] if isinstance(eos, list) else eos
    json.dump(cfg, open(os.path.join(tmp, "config.json"), "w"), indent=2)
    json.dump({"bos_token_id": gen["bos_token_id"], "eos_token_id": eos if isinstance(eos, list) else [eos]},
              open(os.path.join(tmp, "generation_config.json"), "w"), indent=2)
    json.dump(tok, open(os.path.join(tmp, "tokenizer.json"), "w", encoding="utf-8"), ensure_ascii=False)
    tc = os.path.join(tok_dir, "tokenizer_config.json")
    if os.path.exists(tc):
        shutil.copy(tc, tmp)
    for f in os.listdir(src):
        if f.endswith(".safetensors") or f.endswith(".safetensors.index.json"):
            os.symlink(os.path.abspath(os.path.join(src, f)), os.path.join(tmp, f))
    os.rename(tmp, out)
    print(f"pad_tokenizer: {out}: {n} ids, {n - len(used)} padded")


if __name__ == "__main__":
    main()
