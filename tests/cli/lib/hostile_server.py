#!/usr/bin/env python3
"""hostile_server.py MODE [LOG]: an OpenAI-like HTTP server on a free loopback port
(printed on stdout) that misbehaves as MODE says, for the tests of `moerun
bench serve` (a server is a stranger to the client: what it sends is bad
input). GET /v1/models answers a model list unless MODE is about it; POST
/v1/completions answers by MODE:
  models404   /v1/models is a 404 with an empty body
  modelsbig   /v1/models sends bytes without end
  hugeline    one SSE line without end
  endlesstext events of 1 MiB of text each, without end
  garbage     bytes that are not an event stream
  usage_neg   a stream whose usage.completion_tokens is -5
  usage_big   a stream whose usage.completion_tokens is far above max_tokens
  nultext     a good stream whose text holds a NUL byte (a model may write one)
  eosfirst    a stream that ends at once: no text, finish_reason stop, usage 1 token
  notext      a stream of no text and no usage, [DONE]
  cutempty    a stream of no text but a usage of 1 token, cut before [DONE]
  record      a good stream of min(2, max_tokens) tokens (sglang's form on
              /generate); /tokenize in llama-server's form only (a token
              a word, one more with add_special; none for another form);
              each request's path and
              body appended to LOG as one JSON line {"path", "body"} (what a
              client sent, for the tests to read), and every request's path
              and Authorization header (null without one) to LOG.auth; with
              PREFIX (record LOG PREFIX: vllm:, sglang:, llamacpp:), GET
              /metrics counts the completions' tokens and requests under that
              server's names (else it is a 404)
Runs until killed; each connection in its own thread."""
import json
import socket
import sys
import threading

MODE = sys.argv[1]
PREFIX = sys.argv[3] if len(sys.argv) > 3 else None
LOCK = threading.Lock()
SENT = {"tokens": 0, "requests": 0}  # record mode: the completions answered (under LOCK)
SSE = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"


def event(obj):
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def endless(c, head):
    c.sendall(head)
    chunk = b"x" * (1 << 20)
    while True:  # until the client closes (then sendall raises)
        c.sendall(chunk)


def handle(c):
    try:
        data = b""
        while b"\r\n\r\n" not in data:
            d = c.recv(65536)
            if not d:
                return
            data += d
        head, _, rest = data.partition(b"\r\n\r\n")
        n, auth = 0, None
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                n = int(line.split(b":")[1])
            if line.lower().startswith(b"authorization:"):
                auth = line.split(b":", 1)[1].strip().decode()
        while len(rest) < n:
            rest += c.recv(65536)
        if MODE == "record":
            with LOCK, open(sys.argv[2] + ".auth", "a") as f:
                f.write(json.dumps({"path": head.split(b" ")[1].decode(), "auth": auth}) + "\n")
        path = head.split(b" ")[1]
        if path == b"/v1/models":
            if MODE == "models404":
                c.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            elif MODE == "modelsbig":
                endless(c, b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n")
            else:
                body = b'{"object":"list","data":[{"id":"m"}]}'
                c.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
                          b"Connection: close\r\n\r\n%s" % (len(body), body))
            return
        text = event({"choices": [{"index": 0, "text": "a"}]})
        if MODE == "record":
            if path == b"/metrics" and PREFIX:
                with LOCK:
                    gen = "tokens_predicted_total" if PREFIX == "llamacpp:" else "generation_tokens_total"
                    m = (f"# TYPE {PREFIX}{gen} counter\n{PREFIX}{gen} {SENT['tokens']}\n"
                         f"{PREFIX}prompt_tokens_total 0\n")
                    if PREFIX != "llamacpp:":
                        m += f'{PREFIX}request_success_total{{finished_reason="length"}} {SENT["requests"]}\n'
                m = m.encode()
                c.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n"
                          b"Connection: close\r\n\r\n%s" % (len(m), m))
                return
            if not head.startswith(b"POST"):  # /metrics and the like: none here
                c.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                return
            body = json.loads(rest[:n])
            if path == b"/tokenize":  # llama-server's form only: {"content", "add_special"}; a token a word (and
                # for a request without "content", no token: the answer of a server that reads no other field)
                words = len(body.get("content", "").split())
                toks = json.dumps({"tokens": list(range(words + bool(words and body.get("add_special"))))})
                c.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
                          b"Connection: close\r\n\r\n%s" % (len(toks), toks.encode()))
                return
            with LOCK, open(sys.argv[2], "a") as f:
                f.write(json.dumps({"path": path.decode(), "body": body}) + "\n")
            if path == b"/generate":  # sglang's native stream: the text so far and the count, per token
                k = min(2, body["sampling_params"]["max_new_tokens"])
                c.sendall(SSE + b"".join(event({"text": "a" * (i + 1), "meta_info": {"completion_tokens": i + 1}})
                                         for i in range(k)) + b"data: [DONE]\n\n")
                return
            k = min(2, body.get("max_tokens", 2))
            with LOCK:  # counted before the answer: a client that has it and reads /metrics finds it
                SENT["tokens"] += k
                SENT["requests"] += 1
            c.sendall(SSE + text * k + event({"choices": [], "usage": {"completion_tokens": k}}) + b"data: [DONE]\n\n")
            return
        if MODE == "hugeline":
            endless(c, SSE + b"data: ")
        elif MODE == "endlesstext":
            c.sendall(SSE)
            ev = event({"choices": [{"index": 0, "text": "a" * (1 << 20)}]})
            while True:  # until the client closes (then sendall raises)
                c.sendall(ev)
        elif MODE == "garbage":
            c.sendall(SSE + b"\x00\xff\xfe garbage\n\ndata: {not json\n\ndata: [DONE]\n\n")
        elif MODE == "nultext":
            c.sendall(SSE + event({"choices": [{"index": 0, "text": "a\u0000"}]}) * 2 +
                      event({"choices": [], "usage": {"completion_tokens": 2}}) + b"data: [DONE]\n\n")
        elif MODE == "eosfirst":
            c.sendall(SSE + event({"choices": [{"index": 0, "text": "", "finish_reason": "stop"}]}) +
                      event({"choices": [], "usage": {"completion_tokens": 1}}) + b"data: [DONE]\n\n")
        elif MODE == "cutempty":
            c.sendall(SSE + event({"choices": [], "usage": {"completion_tokens": 1}}))
        elif MODE == "notext":
            c.sendall(SSE + event({"choices": [{"index": 0, "text": ""}]}) + b"data: [DONE]\n\n")
        elif MODE in ("usage_neg", "usage_big"):
            ct = -5 if MODE == "usage_neg" else 99999999999
            c.sendall(SSE + text + event({"choices": [], "usage": {"completion_tokens": ct}}) + b"data: [DONE]\n\n")
        else:
            c.sendall(b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
    except OSError:
        pass
    finally:
        c.close()


s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", 0))
s.listen(64)
print(s.getsockname()[1], flush=True)
while True:
    conn, _ = s.accept()
    threading.Thread(target=handle, args=(conn,), daemon=True).start()
