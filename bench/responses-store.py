#!/usr/bin/env python3
"""responses-store.py MOERUN MODEL [--store-mb N] [--requests N] [--chain | --no-chain]

The memory of `moerun serve`'s Responses store under a long run: one server (started here on a free
loopback port, with --debug-forced-output so that every answer is a few tokens), then N Responses
requests of ~330 prompt tokens each, three in four chained to the previous one with
previous_response_id (--chain, the default). Every 2,000 requests it prints the server's RSS beside
the store's own gauges from /metrics (responses stored, their bytes against the bound, evictions).
With --no-chain and --store-mb 0 it is the same load without a store: the RSS the rest of the server
(the KV pool and its prefix cache filling) reaches, the baseline to read the store's share against.
"""
import argparse
import json
import socket
import subprocess
import sys
import time
import urllib.request


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("moerun")
    ap.add_argument("model")
    ap.add_argument("--store-mb", type=int, default=2)
    ap.add_argument("--requests", type=int, default=12000)
    ap.add_argument("--chain", dest="chain", action="store_true", default=True)
    ap.add_argument("--no-chain", dest="chain", action="store_false")
    a = ap.parse_args()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    srv = subprocess.Popen([a.moerun, "serve", "--model", a.model, "--port", str(port), "--context-length", "4096",
                            "--debug-forced-output", "--skip-self-check", "--response-store-mb", str(a.store_mb)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(600):
            try:
                if urllib.request.urlopen(url + "/health", timeout=2).status == 200:
                    break
            except OSError:
                time.sleep(0.1)

        def metric(name):
            text = urllib.request.urlopen(url + "/metrics", timeout=30).read().decode()
            v = [float(ln.split()[-1]) for ln in text.splitlines() if ln.startswith("moerun:" + name + "{")]
            return v[0] if v else 0.0

        def rss_mib():
            with open(f"/proc/{srv.pid}/status") as f:
                return next(int(ln.split()[1]) // 1024 for ln in f if ln.startswith("VmRSS"))

        words = "word " * 300
        prev, failed = None, 0
        print(f"store {a.store_mb} MiB, {'chained' if a.chain else 'unchained'} requests")
        for i in range(1, a.requests + 1):
            body = {"input": f"{i} {words}", "max_output_tokens": 4, "debug_forced_output": "T.</think>Ok."}
            if prev and i % 4 and a.chain:
                body["previous_response_id"] = prev
            req = urllib.request.Request(url + "/v1/responses", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=60) as f:
                    r = json.loads(f.read())
                prev = r["id"] if r.get("store") else None
            except urllib.error.HTTPError:
                failed, prev = failed + 1, None  # a chain past the context: start another
            if i % 2000 == 0:
                print(f"{i:6d} requests: RSS {rss_mib()} MiB; stored {metric('responses_stored'):.0f}, "
                      f"{metric('responses_store_bytes') / 2**20:.2f} of {a.store_mb} MiB, "
                      f"evicted {metric('responses_evicted_total'):.0f}; refused {failed}", flush=True)
    finally:
        srv.terminate()
        srv.wait(timeout=60)


if __name__ == "__main__":
    sys.exit(main())
