"""An openpi policy server for the tests and the bench: openpi-server's own
WebsocketPolicyServer (from PyPI) serving a small test policy. Runs in the peer venv.

    python openpi_peer_server.py --port P [--policy test|nowork] [--metadata JSON]
                                 [--tls CERT KEY] [--api-key KEY] [--record PATH]
                                 [--first-delay S]

Without --tls and --api-key it is `WebsocketPolicyServer(...).serve_forever()`, unchanged.
With either, the same server's connection handler and health check are served through
websockets with TLS and/or a check of the `Authorization: Api-Key` header (what a
deployment puts in front of openpi's server).

The test policy reads `prompt`: "raise" raises RuntimeError("test policy failure"),
"hang" blocks forever (openpi's server then answers nothing, not even /healthz),
"sleep:S" sleeps S seconds first. With --first-delay S the process's first inference
takes S seconds longer (a JIT compile: a real openpi policy compiles its forward pass on
its first call, and blocks the server meanwhile, as this does). It answers `actions` =
the request's `want_actions` (else zeros 10x8 float32) and `echo`: per request key, its
type, dtype, shape and a checksum, so a test can see exactly what arrived.
"""

from __future__ import annotations

import argparse
import asyncio
import http
import json
import time

import numpy as np
import websockets.asyncio.server as ws_server
from openpi_client import base_policy
from openpi_server import websocket_policy_server as wps
from peer_describe import describe

ZEROS = np.zeros((10, 8), dtype=np.float32)


class TestPolicy(base_policy.BasePolicy):
    def __init__(self, record=None, first_delay=0.0):
        self.record = record  # a path: each request's description appended as a JSON line
        self.first_delay = first_delay  # the first inference's "compile" (seconds)

    def infer(self, obs):
        if self.record:
            with open(self.record, "a") as out:
                out.write(json.dumps(describe(obs)) + "\n")
        if self.first_delay:
            delay, self.first_delay = self.first_delay, 0.0
            time.sleep(delay)
        prompt = obs.get("prompt", "")
        if prompt == "raise":
            raise RuntimeError("test policy failure")
        if prompt == "hang":
            time.sleep(3600)
        if isinstance(prompt, str) and prompt.startswith("sleep:"):
            time.sleep(float(prompt[6:]))
        actions = obs.get("want_actions", ZEROS)
        return {"actions": actions, "echo": describe(obs)}


class NoWorkPolicy(base_policy.BasePolicy):
    """The bench's policy: does no work, answers 10x8 float32 zeros."""

    def infer(self, obs):
        return {"actions": ZEROS}


def guarded(api_key):
    """openpi's health check, then (for the websocket) the API key check."""
    want = f"Api-Key {api_key}"

    def process_request(connection, request):
        answer = wps._health_check(connection, request)
        if answer is not None or api_key is None:
            return answer
        if request.headers.get("Authorization") != want:
            return connection.respond(http.HTTPStatus.UNAUTHORIZED, "bad api key\n")
        return None

    return process_request


async def serve_wrapped(server, host, port, ssl_ctx, api_key):
    async with ws_server.serve(
        server._handler,
        host,
        port,
        compression=None,
        max_size=None,
        process_request=guarded(api_key),
        ssl=ssl_ctx,
    ) as srv:
        await srv.serve_forever()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--policy", choices=("test", "nowork"), default="test")
    ap.add_argument("--metadata", default="{}")
    ap.add_argument("--tls", nargs=2, metavar=("CERT", "KEY"))
    ap.add_argument("--api-key")
    ap.add_argument("--record", help="append each request's description to this file")
    ap.add_argument("--first-delay", type=float, default=0.0, help="the first infer's extra s")
    args = ap.parse_args()
    policy = TestPolicy(args.record, args.first_delay) if args.policy == "test" else NoWorkPolicy()
    server = wps.WebsocketPolicyServer(
        policy, host=args.host, port=args.port, metadata=json.loads(args.metadata)
    )
    if args.tls is None and args.api_key is None:
        server.serve_forever()
        return
    ssl_ctx = None
    if args.tls:
        import ssl

        ssl_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ssl_ctx.load_cert_chain(*args.tls)
    asyncio.run(serve_wrapped(server, args.host, args.port, ssl_ctx, args.api_key))


if __name__ == "__main__":
    main()
