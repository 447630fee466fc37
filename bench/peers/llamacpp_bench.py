#!/usr/bin/env python3
"""llamacpp_bench.py — moerun and llama.cpp on the same MiniMax-M2 checkpoint,
timed in one run, interleaved round by round: prefill tok/s of a P-token
prompt and decode tok/s at batch 1 (N greedy tokens after that prompt).

    bench/peers/llamacpp_bench.py --isa avx2|native \\
        --pair fp8=/work/ckpt/real2-fp8:/work/ckpt/peers/real2-q8_0.gguf \\
        --pair nvfp4=/work/ckpt/real2-nvfp4:/work/ckpt/peers/real2-q4_0.gguf [--rounds 3]
        [--llama-server /work/ckpt/peers/llama-server{,-avx2}/bin/llama-server]

Each --pair is LABEL=MOERUN_CHECKPOINT:GGUF (bench/peers/llamacpp_setup.sh
makes the GGUF files). --isa avx2 runs moerun with MOERUN_CPU_MASK=avx512
(its AVX2 kernels) and llama.cpp from the AVX2 build; --isa native runs both
with everything this CPU has. Every round starts each engine in its own
process (load time is not counted; only one engine holds memory at a time),
the same token ids, the same thread count. llama.cpp reads its GGUF file
into memory at load (use_mmap=False), as moerun copies its experts: with
mmap, decode steps after a moerun round page-faulted evicted experts back
from disk (7.8 against 51 tok/s for the same q8_0 file). It prints both versions, every
round, the medians and ranges, and the moerun / llama.cpp ratios; --json
writes them too. --llama-server times llama.cpp through its C++ server instead
(the /completion "timings" of one request per round; AVX-512 without AMX, whose
path in llama-cpp-python's native build crashes on q8_0 on Sapphire Rapids;
with --isa avx2 the server-avx2 build, which the run checks by the server's log;
each GGUF must hold a tokenizer, which the run checks before it starts anything:
llama-server aborts on a request to a GGUF without one).
Exit status: 0 done, 1 an engine failed (its message is
printed), 2 bad usage.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def prompt_ids(n, vocab, seed=12345):
    """deterministic ids in [3, vocab): the same prompt for both engines"""
    x, out = seed, []
    for _ in range(n):
        x = (x * 6364136223846793005 + 1442695040888963407) % (1 << 64)
        out.append(3 + (x >> 33) % (vocab - 3))
    return out


# ---------------- the llama.cpp side (run inside the peer venv) ----------------
def worker(a):
    import llama_cpp
    ids = [int(t) for t in a.ids.split(",")]
    t_load = time.perf_counter()
    llm = llama_cpp.Llama(model_path=a.gguf, n_ctx=len(ids) + a.decode + 16, n_batch=len(ids), n_ubatch=len(ids),
                          n_threads=a.threads, n_threads_batch=a.threads, use_mmap=False, verbose=False,
                          logits_all=False)
    t_load = time.perf_counter() - t_load
    t0 = time.perf_counter()
    llm.eval(ids)
    t_prefill = time.perf_counter() - t0
    import numpy as np
    nv = llm.n_vocab()

    def greedy():  # the last token's logits (the only output row llama.cpp keeps here)
        return int(np.argmax(np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(nv,))))

    tok = greedy()
    t0 = time.perf_counter()
    for _ in range(a.decode):
        llm.eval([tok])
        tok = greedy()
    t_decode = time.perf_counter() - t0
    print(json.dumps({"prefill_tok_s": len(ids) / t_prefill, "decode_tok_s": a.decode / t_decode,
                      "load_s": t_load, "version": llama_cpp.__version__,
                      "system_info": llama_cpp.llama_print_system_info().decode(errors="replace").strip()}))


def run_llamacpp(py, gguf, ids, decode, threads):
    cmd = [py, os.path.abspath(__file__), "--worker", "--gguf", gguf, "--ids", ",".join(map(str, ids)),
           "--decode", str(decode), "--threads", str(threads)]
    p = subprocess.run(cmd, capture_output=True, text=True)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    if p.returncode != 0 or not lines:
        tail = "\n".join((p.stderr or p.stdout).strip().splitlines()[-15:])
        raise RuntimeError(f"llama.cpp could not run {gguf} (exit {p.returncode}):\n{tail}")
    return json.loads(lines[-1])


def server_flags(server):
    """the build-flags.txt line llamacpp_setup.sh writes beside a llama-server's bin/ ("?" if none)"""
    try:
        with open(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(server))), "build-flags.txt")) as f:
            return f.read().strip()
    except OSError:
        return "?"


def gguf_keys(path):
    """the metadata keys of a GGUF file (versions 2 and 3), read with the standard library only;
    raises ValueError where the file is not one"""
    import struct
    scalar = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}  # GGUF value type: bytes

    def need(f, n):  # (a length past the end is refused before any read: no huge allocation)
        if n > size - f.tell():
            raise ValueError("truncated metadata")
        return f.read(n)

    def u32(f):
        return struct.unpack("<I", need(f, 4))[0]

    def u64(f):
        return struct.unpack("<Q", need(f, 8))[0]

    def skip(f, t, n=1):
        if t in scalar:
            f.seek(scalar[t] * n, 1)
        elif t == 8:  # string: u64 length, bytes
            for _ in range(n):
                f.seek(u64(f), 1)
        elif t == 9:  # array: element type, u64 count, elements
            for _ in range(n):
                et = u32(f)
                skip(f, et, u64(f))
        else:
            raise ValueError(f"unknown value type {t}")

    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if need(f, 4) != b"GGUF":
            raise ValueError("no GGUF magic")
        version = u32(f)
        if version not in (2, 3):
            raise ValueError(f"GGUF version {version} (2 or 3 expected)")
        u64(f)  # tensor count
        keys = []
        for _ in range(u64(f)):
            keys.append(need(f, u64(f)).decode("utf-8", "replace"))
            skip(f, u32(f))
        return keys


def gguf_tokenizer_problem(path):
    """why a peer cannot tokenize with the GGUF file at path (llama-server aborts at the first request to
    one without a tokenizer), or None"""
    try:
        if "tokenizer.ggml.model" in gguf_keys(path):
            return None
        return f"{path} has no tokenizer, which llama-server needs; bench/peers/gguf_tokenizer.py adds one"
    except (OSError, ValueError) as e:
        return f"{path} is not a readable GGUF file ({e})"


def run_llama_server(server, gguf, ids, decode, threads):
    """one round through llama.cpp's C++ server (bench/peers/llamacpp_setup.sh server, or
    server-avx2 for --isa avx2): started for the round (its load not timed), one /completion of the
    prompt ids and decode + 1 tokens, its own "timings" (prompt_per_second, predicted_per_second);
    --load-mode none (no mmap), as the llama-cpp-python worker reads its file into memory"""
    import socket
    import tempfile
    import urllib.request
    with socket.socket() as so:
        so.bind(("127.0.0.1", 0))
        port = so.getsockname()[1]
    log = tempfile.TemporaryFile(mode="w+")
    cmd = [server, "-m", gguf, "--host", "127.0.0.1", "--port", str(port), "-t", str(threads), "-tb", str(threads),
           "-c", str(len(ids) + decode + 16), "-b", str(len(ids)), "-ub", str(len(ids)), "--parallel", "1",
           "--no-webui", "--load-mode", "none"]
    p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)

    def fail(why):
        log.seek(0)
        tail = "\n".join(log.read().strip().splitlines()[-12:])
        raise RuntimeError(f"llama-server could not run {gguf} ({why}):\n{tail}")
    try:
        t_load = time.perf_counter()
        while True:
            if p.poll() is not None:
                fail(f"exit {p.returncode} while loading")
            try:
                if urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).status == 200:
                    break
            except OSError:
                pass
            if time.perf_counter() - t_load > 600:
                fail("not ready within 600 s")
            time.sleep(0.2)
        t_load = time.perf_counter() - t_load
        body = json.dumps({"prompt": ids, "n_predict": decode + 1, "temperature": 0, "ignore_eos": True,
                           "cache_prompt": False}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{port}/completion", body, {"Content-Type": "application/json"})
        try:
            t = json.load(urllib.request.urlopen(req, timeout=1200))["timings"]
        except (OSError, KeyError, ValueError) as e:
            fail(f"/completion: {e}; a GGUF without a tokenizer makes it abort: bench/peers/gguf_tokenizer.py adds one")
        ver = subprocess.run([server, "--version"], capture_output=True, text=True)
        vline = [ln for ln in (ver.stdout + ver.stderr).splitlines() if ln.startswith("version")]
        return {"prefill_tok_s": float(t["prompt_per_second"]), "decode_tok_s": float(t["predicted_per_second"]),
                "load_s": t_load, "version": vline[0] if vline else "?",
                "system_info": "llama-server " + server_flags(server)}
    finally:
        p.terminate()
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        log.close()


# ---------------- the moerun side ----------------
STATS = re.compile(r"prefill: (\d+) tokens in ([\d.]+) s \(([\d.]+) tok/s\); decode: (\d+) tokens in ([\d.]+) s "
                   r"\(([\d.]+) tok/s\)")


def run_moerun(moerun, ckpt, ids, decode, threads, env):
    cmd = [moerun, "generate", "--model", ckpt, "--prompt-ids", ",".join(map(str, ids)), "-n", str(decode + 1),
           "--stats", "--threads", str(threads)]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    m = STATS.search(p.stdout + p.stderr)
    if p.returncode != 0 or not m:
        tail = "\n".join((p.stderr or p.stdout).strip().splitlines()[-15:])
        raise RuntimeError(f"moerun could not run {ckpt} (exit {p.returncode}):\n{tail}")
    kern = re.search(r"kernels (\w+)", p.stdout + p.stderr)
    return {"prefill_tok_s": float(m.group(3)), "decode_tok_s": float(m.group(6)),
            "kernels": kern.group(1) if kern else "?"}


def rng(v):
    return f"{statistics.median(v):8.1f} [{min(v):.1f}-{max(v):.1f}]"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--gguf", help=argparse.SUPPRESS)
    ap.add_argument("--ids", help=argparse.SUPPRESS)
    ap.add_argument("--isa", choices=["avx2", "native"], default="avx2")
    ap.add_argument("--pair", action="append", default=[], help="LABEL=MOERUN_CHECKPOINT:GGUF (repeatable)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prefill", type=int, default=512, help="prompt tokens (default 512)")
    ap.add_argument("--decode", type=int, default=32, help="decode steps at batch 1 (default 32)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--moerun", default=os.path.join(ROOT, "build", "moerun"))
    ap.add_argument("--peers", default=os.environ.get("PEERS", os.path.join(ROOT, "build", "peers")))
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--llama-server", help="time llama.cpp through this llama-server binary instead of llama-cpp-python "
                    "(llamacpp_setup.sh server: the CPU's AVX2 / AVX-512 / AVX-VNNI, AMX off, for --isa native; "
                    "server-avx2: AVX-512 off, for --isa avx2); the GGUF files need a tokenizer (gguf_tokenizer.py)")
    a = ap.parse_args()
    if a.worker:
        worker(a)
        return 0
    if not a.pair:
        ap.error("give at least one --pair LABEL=CHECKPOINT:GGUF")
    if a.rounds < 1 or a.prefill < 1 or a.decode < 1 or a.threads < 1:
        ap.error("--rounds, --prefill, --decode and --threads must be >= 1")
    pairs = []
    for s in a.pair:
        m = re.fullmatch(r"([\w.-]+)=([^:]+):(.+)", s)
        if not m:
            ap.error(f"--pair {s!r}: expected LABEL=CHECKPOINT:GGUF")
        label, ckpt, gguf = m.groups()
        for f in (os.path.join(ckpt, "config.json"), gguf):
            if not os.path.exists(f):
                ap.error(f"--pair {label}: {f} does not exist (bench/peers/llamacpp_setup.sh makes the GGUF files)")
        pairs.append((label, ckpt, gguf))
    py = os.path.join(a.peers, "venv-avx2" if a.isa == "avx2" else "venv-native", "bin", "python")
    if a.llama_server:
        if not os.access(a.llama_server, os.X_OK):
            ap.error(f"{a.llama_server} is not an executable (bench/peers/llamacpp_setup.sh server)")
        if a.isa == "avx2" and "AVX512=OFF" not in server_flags(a.llama_server).split():
            ap.error(f"--isa avx2 needs llama-server built without AVX-512 (bench/peers/llamacpp_setup.sh server-avx2); "
                     f"{a.llama_server}'s build-flags.txt says: {server_flags(a.llama_server)}")
        for label, _, gguf in pairs:
            why = gguf_tokenizer_problem(gguf)
            if why:
                ap.error(f"--pair {label}: {why}")
    elif not os.path.exists(py):
        ap.error(f"{py} is missing: run bench/peers/llamacpp_setup.sh venv first")
    if not os.access(a.moerun, os.X_OK):
        ap.error(f"{a.moerun} is not an executable (make build)")
    env = dict(os.environ)
    env.pop("MOERUN_CPU_MASK", None)
    if a.isa == "avx2":
        env["MOERUN_CPU_MASK"] = "avx512"
    mver = subprocess.run([a.moerun, "version"], capture_output=True, text=True, env=env).stdout.strip().splitlines()
    print(f"moerun: {mver[0] if mver else '?'}")
    results, failed = {}, False
    for label, ckpt, gguf in pairs:
        with open(os.path.join(ckpt, "config.json")) as f:
            vocab = json.load(f)["vocab_size"]
        ids = prompt_ids(a.prefill, vocab)
        r = {"moerun": [], "llamacpp": [], "checkpoint": ckpt, "gguf": gguf}
        print(f"\n== {label}: moerun {ckpt} vs llama.cpp {os.path.basename(gguf)}; {a.prefill} prompt tokens, "
              f"{a.decode} decode steps, {a.threads} threads, isa {a.isa}")
        for rd in range(a.rounds):
            try:
                for eng in (("llamacpp", "moerun") if rd % 2 == 0 else ("moerun", "llamacpp")):
                    if eng == "moerun":
                        v = run_moerun(a.moerun, ckpt, ids, a.decode, a.threads, env)
                    else:
                        if a.llama_server:
                            v = run_llama_server(a.llama_server, gguf, ids, a.decode, a.threads)
                            if rd == 0:
                                print(f"llama.cpp: llama-server {v['version']}")
                        else:
                            v = run_llamacpp(py, gguf, ids, a.decode, a.threads)
                            if rd == 0:
                                print(f"llama.cpp: llama-cpp-python {v['version']}; {v['system_info']}")
                    r[eng].append(v)
                    print(f"  round {rd + 1} {eng:9s} prefill {v['prefill_tok_s']:8.1f} tok/s   decode "
                          f"{v['decode_tok_s']:7.2f} tok/s" + (f"   (kernels {v['kernels']})" if eng == "moerun" else
                                                               f"   (load {v['load_s']:.1f} s)"), flush=True)
            except RuntimeError as e:
                print(f"  {e}", file=sys.stderr)
                r["error"] = str(e)
                failed = True
                break
        if r["moerun"] and r["llamacpp"]:
            for key, what in (("prefill_tok_s", f"prefill {a.prefill}"), ("decode_tok_s", "decode batch 1")):
                mo = [v[key] for v in r["moerun"]]
                lc = [v[key] for v in r["llamacpp"]]
                ratio = [x / y for x, y in zip(mo, lc)]
                r[key + "_ratio"] = ratio
                print(f"  {what:16s} moerun {rng(mo)}  llama.cpp {rng(lc)}  tok/s; moerun / llama.cpp "
                      f"{statistics.median(ratio):.2f}x [{min(ratio):.2f}-{max(ratio):.2f}] (per round)")
        results[label] = r
    if a.json:
        tmp = a.json + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"isa": a.isa, "threads": a.threads, "prefill": a.prefill, "decode": a.decode,
                       "llama_server": a.llama_server,
                       "moerun_version": mver, "results": results}, f, indent=1)
        os.replace(tmp, a.json)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
