"""``sinkwindow serve``: an OpenAI-compatible HTTP server whose memory per conversation is fixed.

- :mod:`.engine`: one worker thread owns the model; requests join and leave between steps, each
  with its own bounded cache (a prompt is prefilled a chunk per turn so it never stalls the others),
  and under ``swa``/``evict`` the generating ones decode as rows of one batched forward;
- :mod:`.sessions`: conversations that keep their cache between requests, evicted under a count
  and a byte budget;
- :mod:`.text`: incremental detokenizing and stop strings; :mod:`.answer`: one answer's text, stop
  and logprobs, on the worker thread; :mod:`.chat`: a session's chat turns as one conversation;
- :mod:`.sampling`: presence/frequency penalties, logit_bias and logprobs;
- :mod:`.protocol`: the OpenAI request and response shapes, the table of every field, and errors;
- :mod:`.security`: API keys, the Host and content-type guard, the request byte limit;
- :mod:`.app`: the Starlette application (``/v1/completions``, ``/v1/chat/completions`` with
  server-sent events, ``/v1/models``, ``/v1/sessions``, ``/health``);
- :mod:`.cli`: the ``serve`` subcommand (uvicorn).

Why not transformers' own ``transformers serve``: it loads models by id in a separate process (a
patched model object cannot reach it), its continuous batching builds its own masks and takes only
``sdpa``/eager/flash attention, and its sliding-window allocator is a plain ring buffer that
overwrites the sinks; carrying SWA(w, s) there would take process-wide monkeypatches of its
internals. Here the runtime's own cache and masks, tested against the fp64 reference, serve
every request.
"""

from .._lazy import lazy_package

# Public names by the module that defines them; each loads on first use (see _lazy.py).
__all__ = lazy_package(
    __name__,
    {
        ".app": ["build_app"],
        ".engine": ["Engine", "EngineBusyError", "Job"],
        ".protocol": ["APIError", "GenerationRequest", "parse_request"],
        ".sampling": ["SamplingParams"],
        ".sessions": ["Session", "SessionBusyError", "SessionStore"],
        ".text": ["IncrementalDecoder", "StopMatcher"],
    },
)
