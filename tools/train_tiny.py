#!/usr/bin/env python3
"""train_tiny.py — trains moerun's default model: a small MiniMax-M2 on the
King James Bible, with its own byte-level BPE tokenizer in MiniMax-M2's form.

Owns: models/tiny-kjv/ (config.json, generation_config.json, model.safetensors
in bf16 with MiniMax-M2's HF tensor names, tokenizer.json,
tokenizer_config.json with a MiniMax-M2-form chat template, valid.txt — the
held-out chapters — train_log.json) and models/tiny-kjv/golden.bin (logits of
the committed bf16 checkpoint computed by transformers' MiniMaxM2ForCausalLM,
fp32 arithmetic; tests/test_trained.c checks moerun's forward against it).

Corpus: the King James Version (1611, public domain) as Debian's
`bible-kjv-text` package ships it, read through the `bible` program of the
`bible-kjv` package (apt-get install bible-kjv). One chapter in 25 is held out
(valid.txt, never trained on, nor used for the tokenizer).

Training documents:
  * plain chapters: "Genesis 1\\n\\nIn the beginning ...\\n...\\n" then EOS;
  * chat samples rendered with the model's own chat template (two tasks:
    a verse reference -> that verse; a verse -> the verses after it), so that
    `moerun chat` meets the template, the <think> reasoning block and EOS as
    it will at run time.
The architecture is transformers' MiniMaxM2ForCausalLM itself (sigmoid router
+ e_score_correction_bias, top-k renormalized, QK-norm over the whole q / k
vectors, partial NeoX RoPE, GQA, SiLU experts), so it cannot drift from the
one moerun runs. The correction bias is learned the auxiliary-loss-free way
(after each step, bias += rate * sign(mean load - expert load)).

Run it until it prints "done" (each run trains for at most --minutes, then
checkpoints into --work and exits; the next run resumes):
    apt-get install bible-kjv
    pip install torch transformers tokenizers safetensors jinja2 numpy
    python3 tools/train_tiny.py --work /work/ckpt/train_tiny --out models/tiny-kjv --minutes 9
"""
import argparse
import json
import math
import os
import random
import re
import shutil
import struct
import subprocess
import sys
import time
import unicodedata

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

# ---- the model: every matrix dim a multiple of 128 (FP8 block) and of 16 (NVFP4)
CFG = dict(
    vocab=4096, hidden=256, layers=4, heads=4, kv_heads=2, head_dim=64, rotary_dim=32,
    experts=8, top_k=2, inter=256, rope_theta=10000.0, eps=1e-6, max_pos=4096,
)
# ---- training
TRAIN = dict(
    seed=20250101, ctx=256, batch=8, steps=1000, lr=3e-3, lr_min=2e-4, warmup=50,
    wd=0.1, clip=1.0, bias_rate=1e-3, eval_every=250, ckpt_every=100,
)
HOLDOUT_EVERY = 25  # chapter i (0-based, in canon order) is held out when i % 25 == 12
CHAT_SAMPLES = 8000

BOS, ROLE, EOS = "]~!b[", "]~b]", "[e~["
THINK, ENDTHINK, TC, ENDTC = "<think>", "</think>", "<minimax:tool_call>", "</minimax:tool_call>"
# (content, special): role and message markers are special (dropped by
# skip_special_tokens); the reasoning / tool-call markers are not, so that a
# decoder keeps them for the parsers (as MiniMax-M2's own tokenizer does).
ADDED = [(BOS, True), (ROLE, True), (EOS, True), (THINK, False), (ENDTHINK, False), (TC, False), (ENDTC, False)]
SPLIT_REGEX = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
               r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
               r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
SYSTEM = "You are a helpful assistant."
TEMPLATE = os.path.join(HERE, "train_tiny_template.jinja")


# ---------------------------------------------------------------- corpus
def read_kjv():
    """[(book, chapter, [verse text...])] in canon order, from the bible program."""
    exe = shutil.which("bible")
    if not exe:
        sys.exit("train_tiny: the `bible` program is missing: apt-get install bible-kjv")
    txt = subprocess.run([exe, "-l100000", "Gen1:1-Rev22:21"], check=True, capture_output=True, text=True).stdout
    chapters, cur = [], None
    for line in txt.split("\n"):
        if not line.strip():
            continue
        m = re.match(r"^\s+(\d+) (.*)$", line)
        if m:
            assert cur is not None and int(m.group(1)) == len(cur[2]) + 1, line
            cur[2].append(unicodedata.normalize("NFC", m.group(2).strip()))
            continue
        m = re.match(r"^(.*\S) (\d+)$", line)
        assert m, "unexpected line from bible: %r" % line
        cur = (m.group(1), int(m.group(2)), [])
        chapters.append(cur)
    assert len(chapters) == 1189 and sum(len(c[2]) for c in chapters) == 31102, "not the whole KJV"
    return chapters


def chapter_text(ch):
    book, n, verses = ch
    return "%s %d\n\n%s\n" % (book, n, "\n".join(verses))


def is_holdout(i):
    return i % HOLDOUT_EVERY == 12


def render_chat(template, messages, add_generation_prompt=False):
    return template.render(messages=messages, add_generation_prompt=add_generation_prompt, tools=None)


def jinja_template(src):
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(msg):
        raise jinja2.exceptions.TemplateError(msg)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[])
    env.filters["tojson"] = lambda x, indent=None, ensure_ascii=False: json.dumps(x, indent=indent, ensure_ascii=ensure_ascii)
    env.globals["raise_exception"] = raise_exception
    return env.from_string(src)


def chat_samples(train_chapters, n, rng, template):
    """Two tasks: a reference -> the verse; a verse -> the following verses."""
    out = []
    for _ in range(n):
        book, c, verses = train_chapters[rng.randrange(len(train_chapters))]
        v = rng.randrange(len(verses))
        if rng.random() < 0.5 or v + 1 >= len(verses):
            user = "%s %d:%d" % (book, c, v + 1)
            think = "The user asks for %s chapter %d, verse %d." % (book, c, v + 1)
            answer = verses[v]
        else:
            k = min(len(verses) - v - 1, 1 + rng.randrange(2))
            user = verses[v]
            think = "This is %s %d:%d. The user wants the words that follow it." % (book, c, v + 1)
            answer = " ".join(verses[v + 1: v + 1 + k])
        msgs = [{"role": "user", "content": user},
                {"role": "assistant", "content": answer, "reasoning_content": think}]
        if rng.random() < 0.5:
            msgs.insert(0, {"role": "system", "content": SYSTEM})
        out.append(render_chat(template, msgs))
    return out


# ---------------------------------------------------------------- tokenizer
def train_tokenizer(texts, vocab):
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from tokenizers import AddedToken

    tok = Tokenizer(models.BPE(ignore_merges=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    # the BPE vocabulary fills the ids below the added tokens; ids past them
    # up to config vocab_size are padding, as in MiniMax-M2 (200064 > its tokenizer)
    n_bpe = vocab - 64
    trainer = trainers.BpeTrainer(vocab_size=n_bpe, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[])
    tok.train_from_iterator(texts, trainer=trainer)
    assert tok.get_vocab_size() <= n_bpe
    tok.add_tokens([AddedToken(c, special=s, normalized=False, lstrip=False, rstrip=False, single_word=False)
                    for c, s in ADDED if not s])
    tok.add_special_tokens([AddedToken(c, special=s, normalized=False, lstrip=False, rstrip=False,
                                       single_word=False) for c, s in ADDED if s])
    from tokenizers import processors
    tok.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    return tok


def tokenizer_config(template_src):
    return {
        "add_bos_token": False,
        "add_eos_token": False,
        "added_tokens_decoder": {},
        "bos_token": BOS,
        "eos_token": EOS,
        "unk_token": None,
        "pad_token": None,
        "clean_up_tokenization_spaces": False,
        "model_max_length": CFG["max_pos"],
        "tokenizer_class": "PreTrainedTokenizerFast",
        "chat_template": template_src,
    }


# ---------------------------------------------------------------- model
def hf_config(c, bos_id, eos_id):
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
        "max_position_embeddings": c["max_pos"],
        "attn_type_list": [1] * c["layers"],
        "use_mtp": False,
        "num_mtp_modules": 0,
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
        "initializer_range": 0.02,
        "router_jitter_noise": 0.0,
        "torch_dtype": "bfloat16",
    }


def build_model(cfg_json):
    from transformers import MiniMaxM2Config, MiniMaxM2ForCausalLM

    conf = MiniMaxM2Config.from_dict(dict(cfg_json))
    conf._attn_implementation = "sdpa"
    return MiniMaxM2ForCausalLM(conf)


def hf_tensors(model, c):
    """The trained model's state under MiniMax-M2's checkpoint names
    (per-expert w1 / w3 / w2), bf16 except the fp32 correction bias."""
    sd = model.state_dict()
    out = {}
    I = c["inter"]
    for k, v in sd.items():
        v = v.detach().float().contiguous()
        m = re.match(r"model\.layers\.(\d+)\.mlp\.(.*)$", k)
        if not m:
            out[k] = v
            continue
        p = "model.layers.%s.block_sparse_moe." % m.group(1)
        rest = m.group(2)
        if rest == "gate.weight":
            out[p + "gate.weight"] = v
        elif rest == "e_score_correction_bias":
            out[p + "e_score_correction_bias"] = v
        elif rest == "experts.gate_up_proj":
            for x in range(v.shape[0]):
                out[p + "experts.%d.w1.weight" % x] = v[x, :I].contiguous()
                out[p + "experts.%d.w3.weight" % x] = v[x, I:].contiguous()
        elif rest == "experts.down_proj":
            for x in range(v.shape[0]):
                out[p + "experts.%d.w2.weight" % x] = v[x].contiguous()
        else:
            raise SystemExit("train_tiny: unexpected tensor " + k)
    return {k: (v if k.endswith("e_score_correction_bias") else v.to(torch.bfloat16)) for k, v in out.items()}


# ---------------------------------------------------------------- stages
def prepare(work):
    from jinja2 import Template  # noqa: F401  (jinja_template needs jinja2)

    chapters = read_kjv()
    train_ch = [ch for i, ch in enumerate(chapters) if not is_holdout(i)]
    valid_ch = [ch for i, ch in enumerate(chapters) if is_holdout(i)]
    template_src = open(TEMPLATE).read()
    template = jinja_template(template_src)
    rng = random.Random(TRAIN["seed"])
    plain = [chapter_text(ch) for ch in train_ch]
    chats = chat_samples(train_ch, CHAT_SAMPLES, rng, template)
    valid_text = "".join(chapter_text(ch) + "\n" for ch in valid_ch)
    tok = train_tokenizer(plain + chats, CFG["vocab"])
    os.makedirs(work, exist_ok=True)
    tok.save(os.path.join(work, "tokenizer.json"))
    eos = tok.token_to_id(EOS)
    docs = [tok.encode(t).ids + [eos] for t in plain] + [tok.encode(t).ids for t in chats]
    rng.shuffle(docs)
    stream = np.array([i for d in docs for i in d], dtype=np.int32)
    vstream = np.array(tok.encode(valid_text).ids, dtype=np.int32)
    np.save(os.path.join(work, "train.npy"), stream)
    np.save(os.path.join(work, "valid.npy"), vstream)
    with open(os.path.join(work, "valid.txt"), "w") as f:
        f.write(valid_text)
    with open(os.path.join(work, "template.jinja"), "w") as f:
        f.write(template_src)
    # unigram perplexity of the validation tokens under the training counts (add-one)
    counts = np.bincount(stream, minlength=CFG["vocab"]).astype(np.float64) + 1.0
    p = counts / counts.sum()
    uni = float(np.exp(-np.mean(np.log(p[vstream]))))
    meta = {"train_tokens": int(stream.size), "valid_tokens": int(vstream.size), "unigram_valid_ppl": uni,
            "train_chapters": len(train_ch), "valid_chapters": len(valid_ch), "chat_samples": len(chats),
            "bpe_vocab": tok.get_vocab_size(), "valid_bytes": len(valid_text.encode())}
    with open(os.path.join(work, "prepare.json"), "w") as f:
        json.dump(meta, f, indent=2)
    print("prepared:", json.dumps(meta))


def lr_at(step):
    t = TRAIN
    if step < t["warmup"]:
        return t["lr"] * (step + 1) / t["warmup"]
    f = (step - t["warmup"]) / max(1, t["steps"] - t["warmup"])
    return t["lr_min"] + 0.5 * (t["lr"] - t["lr_min"]) * (1 + math.cos(math.pi * min(1.0, f)))


@torch.no_grad()
def eval_ppl(model, vstream, ctx, max_windows=None):
    """Non-overlapping windows of ctx tokens (the last one shorter); each
    window scores its tokens 1..n-1 given the ones before in the window."""
    model.eval()
    nll, n = 0.0, 0
    starts = list(range(0, len(vstream) - 1, ctx))
    if max_windows:
        starts = starts[:max_windows]
    for s in starts:
        w = torch.from_numpy(vstream[s: s + ctx].astype(np.int64))[None]
        if w.shape[1] < 2:
            continue
        lg = model(input_ids=w, use_cache=False).logits[0].float()
        lp = torch.log_softmax(lg[:-1], -1).gather(1, w[0, 1:, None])
        nll -= float(lp.sum())
        n += w.shape[1] - 1
    model.train()
    return math.exp(nll / n), n


def train(work, minutes):
    torch.manual_seed(TRAIN["seed"])
    tok_path = os.path.join(work, "tokenizer.json")
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(tok_path)
    cfgj = hf_config(CFG, tok.token_to_id(BOS), tok.token_to_id(EOS))
    model = build_model(cfgj)
    model.train()
    stream = np.load(os.path.join(work, "train.npy"))
    vstream = np.load(os.path.join(work, "valid.npy"))
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    nodecay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": TRAIN["wd"]},
                             {"params": nodecay, "weight_decay": 0.0}], lr=TRAIN["lr"], betas=(0.9, 0.95))
    ck = os.path.join(work, "ckpt.pt")
    state = {"step": 0, "log": [], "seconds": 0.0, "rng": None}
    if os.path.exists(ck):
        s = torch.load(ck, weights_only=False)
        model.load_state_dict(s["model"])
        opt.load_state_dict(s["opt"])
        state = s["state"]
        print("resumed at step", state["step"])
    gen = np.random.default_rng(TRAIN["seed"] + state["step"])
    moes = [layer.mlp for layer in model.model.layers]
    loads = [torch.zeros(CFG["experts"]) for _ in moes]

    def hook(i):
        def f(mod, inp, out):
            loads[i] += torch.bincount(out[2].reshape(-1), minlength=CFG["experts"]).float()
        return f

    for i, m in enumerate(moes):
        m.gate.register_forward_hook(hook(i))

    def save():
        tmp = ck + ".tmp"
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "state": state}, tmp)
        os.replace(tmp, ck)

    t_start = time.time()
    ctx, B = TRAIN["ctx"], TRAIN["batch"]
    t_last = time.time()
    while state["step"] < TRAIN["steps"]:
        if time.time() - t_start > minutes * 60:
            break
        step = state["step"]
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        starts = gen.integers(0, len(stream) - ctx - 1, size=B)
        x = torch.from_numpy(np.stack([stream[s: s + ctx + 1] for s in starts]).astype(np.int64))
        for l in loads:
            l.zero_()
        out = model(input_ids=x[:, :-1], use_cache=False)
        loss = torch.nn.functional.cross_entropy(out.logits.reshape(-1, CFG["vocab"]).float(), x[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), TRAIN["clip"])
        opt.step()
        with torch.no_grad():  # auxiliary-loss-free balancing of the routing bias
            for m, l in zip(moes, loads):
                m.e_score_correction_bias += TRAIN["bias_rate"] * torch.sign(l.mean() - l)
        state["step"] = step + 1
        now = time.time()
        state["seconds"] += now - t_last
        t_last = now
        if step % 20 == 0:
            print("step %d loss %.4f lr %.2e %.1f s" % (step, float(loss.detach()), lr_at(step), state["seconds"]), flush=True)
        rec = {"step": step + 1, "loss": float(loss.detach())}
        if (step + 1) % TRAIN["eval_every"] == 0 or step + 1 == TRAIN["steps"]:
            ppl, _ = eval_ppl(model, vstream, ctx, max_windows=40)
            rec["valid_ppl_40w"] = ppl
            print("step %d valid ppl (first 40 windows) %.3f" % (step + 1, ppl), flush=True)
        state["log"].append(rec)
        if (step + 1) % TRAIN["ckpt_every"] == 0:
            save()
    save()
    return state["step"] >= TRAIN["steps"]


def golden_prompts(tok, template):
    return [
        tok.encode("In the beginning God created").ids,
        tok.encode("And the LORD spake unto Moses, saying,").ids,
        tok.encode(render_chat(template, [{"role": "user", "content": "John 3:16"}], add_generation_prompt=True)).ids,
    ]


def export(work, out):
    from safetensors.torch import save_file
    from tokenizers import Tokenizer
    from transformers import MiniMaxM2ForCausalLM

    tok = Tokenizer.from_file(os.path.join(work, "tokenizer.json"))
    cfgj = hf_config(CFG, tok.token_to_id(BOS), tok.token_to_id(EOS))
    model = build_model(cfgj)
    s = torch.load(os.path.join(work, "ckpt.pt"), weights_only=False)
    model.load_state_dict(s["model"])
    state = s["state"]
    tensors = hf_tensors(model, CFG)
    tmp = out + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    with open(os.path.join(tmp, "config.json"), "w") as f:
        json.dump(cfgj, f, indent=2)
        f.write("\n")
    with open(os.path.join(tmp, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": cfgj["bos_token_id"], "eos_token_id": [cfgj["eos_token_id"]],
                   "do_sample": True, "temperature": 0.8, "top_p": 0.95}, f, indent=2)
        f.write("\n")
    save_file(tensors, os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
    shutil.copy(os.path.join(work, "tokenizer.json"), os.path.join(tmp, "tokenizer.json"))
    template_src = open(os.path.join(work, "template.jinja")).read()
    with open(os.path.join(tmp, "tokenizer_config.json"), "w") as f:
        json.dump(tokenizer_config(template_src), f, indent=2, ensure_ascii=False)
        f.write("\n")
    shutil.copy(os.path.join(work, "valid.txt"), os.path.join(tmp, "valid.txt"))

    # the oracle: the committed files, loaded back by transformers, fp32 math
    ref, info = MiniMaxM2ForCausalLM.from_pretrained(tmp, dtype=torch.float32, attn_implementation="eager",
                                                     output_loading_info=True)
    ref.eval()
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    os.chmod(os.path.join(tmp, "model.safetensors"), 0o644)
    with torch.no_grad():  # the files hold the trained model: same logits as it, weights rounded to bf16
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16).float())
        model.eval()
        x = torch.tensor([tok.encode("And God said, Let there be light").ids])
        a, b = model(input_ids=x, use_cache=False).logits, ref(input_ids=x, use_cache=False).logits
        assert torch.allclose(a, b, atol=2e-3, rtol=1e-3), "exported checkpoint differs from the trained model"
    vstream = np.load(os.path.join(work, "valid.npy"))
    ctx = TRAIN["ctx"]
    ppl_bf16, n = eval_ppl(ref, vstream, ctx)
    ppl_8192, _ = eval_ppl(ref, vstream[:8192], ctx)  # tests/cli/perplexity.sh checks moerun against this
    stream = np.load(os.path.join(work, "train.npy"))
    ppl_train, _ = eval_ppl(ref, stream[: len(vstream)], ctx)
    meta = json.load(open(os.path.join(work, "prepare.json")))
    print("bf16 checkpoint: valid ppl %.3f over %d tokens (unigram %.1f); train ppl (first %d tokens) %.3f"
          % (ppl_bf16, n, meta["unigram_valid_ppl"], len(vstream), ppl_train))
    template = jinja_template(template_src)
    steps = 24
    blob = bytearray(b"MRGOLD1\0")
    prompts = golden_prompts(tok, template)
    blob += struct.pack("<3i", len(prompts), CFG["vocab"], steps)
    samples = []
    with torch.no_grad():
        for ids in prompts:
            o = ref(input_ids=torch.tensor([ids]), use_cache=True)
            rows, cache = [o.logits[0]], o.past_key_values
            gen = [int(o.logits[0, -1].argmax())]
            for _ in range(steps):
                o = ref(input_ids=torch.tensor([[gen[-1]]]), past_key_values=cache, use_cache=True)
                cache = o.past_key_values
                rows.append(o.logits[0])
                gen.append(int(o.logits[0, -1].argmax()))
            logits = torch.cat(rows, 0)
            blob += struct.pack("<i", len(ids)) + struct.pack("<%di" % len(ids), *ids)
            blob += struct.pack("<%di" % len(gen), *gen)
            blob += logits.numpy().astype("<f4").tobytes()
            samples.append({"prompt": tok.decode(ids, skip_special_tokens=False),
                            "greedy": tok.decode(gen, skip_special_tokens=False)})
            print("greedy:", repr(samples[-1]["prompt"]), "->", repr(samples[-1]["greedy"]))
    with open(os.path.join(tmp, "golden.bin"), "wb") as f:
        f.write(bytes(blob))
    log = {"config": CFG, "train": TRAIN, "corpus": meta, "train_seconds": state["seconds"],
           "steps": state["step"], "final_train_loss_avg50": float(np.mean([r["loss"] for r in state["log"][-50:]])),
           "valid_ppl_bf16_torch": ppl_bf16, "valid_tokens_scored": n, "valid_ppl_bf16_torch_first8192": ppl_8192, "train_ppl_bf16_torch": ppl_train,
           "eval": "non-overlapping windows of %d tokens; each scores its tokens 1..n-1" % ctx,
           "torch": torch.__version__, "greedy_samples": samples,
           "evals": [r for r in state["log"] if "valid_ppl_40w" in r]}
    with open(os.path.join(tmp, "train_log.json"), "w") as f:
        json.dump(log, f, indent=2)
        f.write("\n")
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    print("wrote", out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", default="/work/ckpt/train_tiny", help="checkpoints and the tokenized corpus")
    ap.add_argument("--out", default=os.path.join(ROOT, "models", "tiny-kjv"))
    ap.add_argument("--minutes", type=float, default=9.0, help="training time of this run before it checkpoints")
    ap.add_argument("--threads", type=int, default=1, help="1 is fastest on a busy shared machine")
    ap.add_argument("--export-only", action="store_true", help="write --out from the last checkpoint")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    if not os.path.exists(os.path.join(a.work, "prepare.json")):
        prepare(a.work)
    if a.export_only or train(a.work, a.minutes):
        export(a.work, os.path.abspath(a.out))
        print("done")
    else:
        print("not done: run the same command again to resume")


if __name__ == "__main__":
    main()
