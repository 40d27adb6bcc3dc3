"""The extraction worker process: reads conversion jobs on stdin, answers on stdout.

Run by the pool as `python -m gateway.tools.extract.worker`. Each frame is a 4-byte big-endian
length and a payload; a job's payload is a 4-byte header length, the header (JSON) and the body
bytes, an answer's payload is JSON. JSON, not pickle, both ways: the worker parses hostile input,
and a worker the input subverted must not be able to run code in the daemon through what it
sends back. The worker owns no socket and never touches the network; it lowers its own CPU
priority and caps its address space, so a runaway page costs this process, not the daemon.
End of input (the pool retiring it) ends the process.
"""

from __future__ import annotations

import contextlib
import os
import resource
import struct
import sys
from typing import Any, BinaryIO

import orjson

from gateway.errors import ErrorCode, GatewayError
from gateway.memory import limit_heap_retention, release_free_memory
from gateway.tools.extract.render import RenderedPage, RenderLimits, render_page

FRAME = struct.Struct(">I")
READY = b'{"ready":true}'
# Conversion is batch work: on a small machine (2 cores) the daemon must win the CPU when both
# are runnable, or a tunnel waits for the scheduler while a page converts.
WORKER_NICE = 10
# A page that needs more than this is a bomb; MemoryError then becomes a refusal, not an OOM kill
# of the pod.
MAX_ADDRESS_SPACE_BYTES = 2 * 1024 * 1024 * 1024


def _read_exactly(stream: BinaryIO, size: int) -> bytes | None:
    chunks = []
    while size:
        chunk = stream.read(size)
        if not chunk:
            return None
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def _write_frame(stream: BinaryIO, payload: bytes) -> None:
    stream.write(FRAME.pack(len(payload)) + payload)
    stream.flush()


def run_job(payload: bytes) -> dict[str, Any]:
    (header_size,) = FRAME.unpack_from(payload)
    header = orjson.loads(payload[FRAME.size : FRAME.size + header_size])
    body = payload[FRAME.size + header_size :]
    limits = RenderLimits.from_wire(header["limits"])
    try:
        page = render_page(
            body, header["content_type"], header["status"], header["headers"], header["base_url"], limits=limits
        )
    except MemoryError:
        refusal = GatewayError(ErrorCode.TOO_LARGE, "the page needs more memory than the converter may use")
        page = RenderedPage(refusal=refusal)
    except RecursionError:
        refusal = GatewayError(ErrorCode.TOO_LARGE, "the page nests deeper than the converter may follow")
        page = RenderedPage(refusal=refusal)
    except Exception as exc:
        # A library raising on hostile input must not take the worker down with a traceback in the
        # log (the pool would call it "the converter exited"): a typed refusal naming the error.
        sys.stderr.write(f"extraction worker: {type(exc).__name__} while converting a page\n")
        refusal = GatewayError(ErrorCode.UNSUPPORTED_CONTENT, f"the page could not be converted ({type(exc).__name__})")
        page = RenderedPage(refusal=refusal)
    return page.to_wire()


def serve(jobs: BinaryIO, answers: BinaryIO) -> None:
    _write_frame(answers, READY)
    while True:
        size = _read_exactly(jobs, FRAME.size)
        if size is None:
            return
        payload = _read_exactly(jobs, FRAME.unpack(size)[0])
        if payload is None:
            return
        answer = orjson.dumps(run_job(payload))
        del payload
        _write_frame(answers, answer)
        del answer
        release_free_memory()


def main() -> None:
    with contextlib.suppress(AttributeError, OSError):
        os.nice(WORKER_NICE)
    limit_heap_retention()
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_AS, (MAX_ADDRESS_SPACE_BYTES, MAX_ADDRESS_SPACE_BYTES))
    # The protocol owns fd 1; anything a library prints goes to stderr instead.
    answers = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    # Load the converters before saying ready, so the first job does not pay for the imports.
    import gateway.tools.extract.decode  # noqa: PLC0415
    import gateway.tools.extract.markdown  # noqa: F401, PLC0415

    # The pool closing the pipes (a retired or replaced worker) is the normal end, not an error.
    with contextlib.suppress(BrokenPipeError, KeyboardInterrupt):
        serve(sys.stdin.buffer, answers)


if __name__ == "__main__":
    main()
