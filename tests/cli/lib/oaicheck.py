"""Checks shared by the official-client scripts (tests/cli/openai_client.py, tests/cli/openai_conversations.py):
check() counts and exits 1 on the first failure; expect_exc() wants the client's exception class, and the
server's param and message where given; ended() polls a background response until it has ended; each() runs a request per seed at once."""
import sys
import time
from concurrent.futures import ThreadPoolExecutor

_count = [0]


def checks():
    return _count[0]


def check(cond, what):
    _count[0] += 1
    if not cond:
        print("FAIL:", what)
        sys.exit(1)


def each(fn, seeds):
    """[fn(seed) for seed in seeds], the requests sent at once as concurrent clients send them: the server
    batches them (its continuous batching under structured outputs, each request with its own mask). A check
    that fails in one (SystemExit) or any other exception is raised here."""
    seeds = list(seeds)
    with ThreadPoolExecutor(max_workers=len(seeds)) as ex:
        return list(ex.map(fn, seeds))


def expect_exc(cls, fn, param=None, text=None):
    try:
        fn()
    except cls as e:
        body = e.body if isinstance(e.body, dict) else {}
        if param is not None:
            check(body.get("param") == param, f"{cls.__name__}: param {body.get('param')} != {param}")
        if text is not None:
            check(text in str(e), f"{cls.__name__}: '{text}' not in {e}")
        return
    except Exception as e:  # noqa: BLE001
        check(False, f"expected {cls.__name__}, got {type(e).__name__}: {e}")
    check(False, f"expected {cls.__name__}, got no error")


def ended(client, rid):
    """The background response rid once it has ended (polled for up to ~30 s)."""
    for _ in range(1200):
        g = client.responses.retrieve(rid)
        if g.status not in ("queued", "in_progress"):
            return g
        time.sleep(0.025)
    check(False, f"background response {rid} still {g.status}")
