"""``sinkwindow serve``: load a model under a method and answer OpenAI's API on HTTP (uvicorn)."""

from __future__ import annotations

import argparse
import logging
import os
import sys

from ..cli import args as cli_args
from ..models import resolve
from ..runtime.threads import set_threads

__all__ = ["register", "serve_app"]

logger = logging.getLogger(__name__)


def serve_app(args: argparse.Namespace):
    """The app for ``args`` (model loaded and patched): what ``serve`` runs and tests can start."""
    import torch

    import sinkwindow

    from .app import build_app
    from .engine import Engine
    from .security import is_loopback, keys_from
    from .sessions import SessionStore

    keys = keys_from(args.api_key, os.environ.get("SINKWINDOW_API_KEY"))
    loopback = is_loopback(args.host)
    if not keys and not loopback and not args.allow_unauthenticated:
        raise ValueError(f"--host {args.host} is reachable from other machines: give --api-key KEY (or "
                         "SINKWINDOW_API_KEY), or --allow-unauthenticated to serve anyone")  # fmt: skip

    set_threads(args.threads)
    _, checkpoints = resolve.resolve_checkpoints(args.checkpoint, [args.method], add_methods=False)
    device = resolve.resolve_device(args.device)
    model, tok = sinkwindow.load(
        args.model, method=args.method, checkpoint=checkpoints.get(args.method), device=device,
        dtype=getattr(torch, args.dtype),
    )  # fmt: skip
    engine = Engine(
        model, max_active=args.max_active, max_queue=args.max_queue, chunk_size=args.chunk_size,
        sessions=SessionStore(args.max_sessions), kv_budget=args.kv_budget, block_size=args.kv_block_size,
    )  # fmt: skip
    if engine.pool_note:
        logger.warning("%s", engine.pool_note)
    served = [args.served_model_name or args.model]
    return build_app(engine, tok, served, max_prompt_tokens=args.max_prompt_tokens, api_keys=keys,
                     loopback_only=loopback, max_request_bytes=args.max_request_bytes)  # fmt: skip


def _cmd_serve(args: argparse.Namespace) -> int:
    import starlette  # noqa: F401  (a missing extra fails here, in one line, before the model loads)
    import uvicorn

    app = serve_app(args)
    print(
        f"sinkwindow serve: {args.method} on http://{args.host}:{args.port}/v1", file=sys.stderr, flush=True
    )
    # uvicorn stops on SIGTERM/SIGINT: no new requests, running ones get --shutdown-timeout seconds to
    # finish, then the engine cancels what is left.
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning",
                timeout_graceful_shutdown=args.shutdown_timeout)  # fmt: skip
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve",
        help="an OpenAI-compatible HTTP server (completions, chat, streaming) with fixed memory per request",
        description="Serves /v1/completions and /v1/chat/completions (streamed as server-sent events), "
        "/v1/models, /v1/sessions and /health. Requests join and leave between steps, each with its own "
        "bounded cache; a request's session_id keeps its cache for the next request (an append-only "
        "conversation in constant memory), and idle sessions are evicted under --max-sessions and to make "
        "room in the KV pool (--kv-budget, allocated once at start).",
    )
    cli_args.add_model(p)
    cli_args.add_method(p, "swa:1024:4")
    cli_args.add_checkpoint(p)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: %(default)s)")
    p.add_argument("--port", type=cli_args.integer(0, 65535, what="--port"), default=8000,
                   help="port (default: %(default)s)")  # fmt: skip
    p.add_argument("--served-model-name", default=None, help="the model id clients send (default: --model)")
    p.add_argument("--max-active", type=cli_args.integer(1, what="--max-active"), default=8,
                   help="requests that advance together, one step each per turn (default: %(default)s)")  # fmt: skip
    p.add_argument("--max-queue", type=cli_args.integer(0, what="--max-queue"), default=64,
                   help="waiting requests beyond which new ones get 429 (default: %(default)s)")  # fmt: skip
    p.add_argument("--max-sessions", type=cli_args.integer(1, what="--max-sessions"), default=64,
                   help="idle sessions kept; the least recently used beyond go (default: %(default)s)")  # fmt: skip
    p.add_argument("--kv-budget", type=cli_args.kv_budget, default=None, metavar="BYTES",
                   help="bytes of the KV pool allocated at start, which every request and session draws blocks "
                   "from, e.g. 4GiB (default: 25%% of available RAM, at most 4 GiB; on CUDA 50%% of free GPU memory)")  # fmt: skip
    p.add_argument("--kv-block-size", type=cli_args.integer(1, what="--kv-block-size"), default=16, metavar="TOKENS",
                   help="tokens per KV pool block (one layer's keys and values) (default: %(default)s)")  # fmt: skip
    p.add_argument("--max-prompt-tokens", type=cli_args.integer(1, what="--max-prompt-tokens"), default=None,
                   help="longest prompt accepted (default: what the model's positions allow)")  # fmt: skip
    p.add_argument("--api-key", action="append", default=None, metavar="KEY",
                   help="a key clients must send as Authorization: Bearer KEY (repeatable; also SINKWINDOW_API_KEY, "
                   "comma-separated); each key sees only its own sessions")  # fmt: skip
    p.add_argument("--allow-unauthenticated", action="store_true",
                   help="serve a non-loopback --host without API keys (anyone who reaches it may use it)")  # fmt: skip
    p.add_argument("--max-request-bytes", type=cli_args.kv_budget, default=1 << 20,
                   metavar="BYTES",
                   help="longest request body, e.g. 4MiB (default: 1MiB); longer ones get 413")  # fmt: skip
    p.add_argument("--shutdown-timeout", type=cli_args.real(0.0, inclusive=True, what="--shutdown-timeout"),
                   default=10.0, help="seconds running requests get to finish on SIGTERM (default: %(default)s)")  # fmt: skip
    cli_args.add_chunk_size(p, help="prompt tokens per prefill step")
    cli_args.add_device(p)
    cli_args.add_dtype(p)
    cli_args.add_threads(p)
    p.set_defaults(func=_cmd_serve)
