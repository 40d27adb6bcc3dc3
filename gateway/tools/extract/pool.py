"""Turns a response body into page text off the event loop, so proxy tunnels keep flowing.

Owns the extraction workers: separate processes (`python -m gateway.tools.extract.worker`, a
plain subprocess: no multiprocessing resource tracker, no fork of the daemon's loop and sockets)
that run the CPU-heavy part of web_fetch. A native parse of 2 MiB holds the GIL for tens of
milliseconds, which a thread would not hide, and a hostile page (an HTML or PDF bomb) can take
minutes: each conversion has a hard limit on the worker's CPU time after which the worker is killed
and replaced, and the call gets `too_large`, so one page delays the calls queued behind it by at most that
limit. Workers start on first use and exit after a quiet spell; one by default, since the
footprint of every pod pays for each. Pages small enough that the worst case converts within
~20 ms are handled inline: the round trip would cost more than the work. PDFs always go to a
worker. Never touches the network.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import struct
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson

from gateway.errors import ErrorCode, GatewayError
from gateway.tasks import spawn
from gateway.tools.extract.render import RenderedPage, RenderLimits, is_pdf, render_page

# The largest page whose worst case (nested tables, thousands of attributes on one element, both
# quadratic inside the parser) still converts in ~20 ms on the loop.
INLINE_MAX_BYTES = 4 * 1024
DEFAULT_WORKERS = 1
DEFAULT_IDLE_EXIT_S = 60.0
DEFAULT_TIME_LIMIT_S = 10.0
START_TIMEOUT_S = 15.0
RETIRE_TIMEOUT_S = 2.0
# A worker whose pipe closed mid-job is dying: this long to learn how (a signal means a bomb).
EXIT_STATUS_WAIT_S = 1.0
# An answer is the page text (bounded by max_source_chars) and a few links: anything far larger
# means a worker gone wrong.
MAX_ANSWER_BYTES = 32 * 1024 * 1024
FRAME = struct.Struct(">I")
WRITE_SLICE_BYTES = 256 * 1024
CPU_POLL_S = 0.1
CLOCK_TICKS_PER_S = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


class WorkerGone(Exception):
    """The worker process exited or broke the protocol; it is replaced on the next job."""


class ExtractionWorker:
    """One worker process and the pipe pair that carries its jobs."""

    def __init__(
        self,
        process: subprocess.Popen[bytes],
        reader: asyncio.StreamReader,
        read_transport: asyncio.BaseTransport,
        writer: asyncio.StreamWriter,
    ) -> None:
        self.process = process
        self.reader = reader
        self.read_transport = read_transport
        self.writer = writer
        self.idle_timer: asyncio.TimerHandle | None = None

    @classmethod
    async def start(cls) -> ExtractionWorker:
        # The worker gets only what it needs to import the package: none of the daemon's
        # environment (engine keys, Redis URL) reaches a process that parses hostile input.
        env = {"PYTHONPATH": os.pathsep.join(path for path in sys.path if path)}
        # Started in a thread: fork+exec from the loop (asyncio's subprocess API waits for the
        # exec) held the loop for 2-27 ms.
        process = await asyncio.to_thread(
            subprocess.Popen,
            [sys.executable, "-m", "gateway.tools.extract.worker"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, close_fds=True,
        )  # fmt: skip
        assert process.stdin is not None
        assert process.stdout is not None
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=MAX_ANSWER_BYTES)
        read_transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), process.stdout)
        transport, protocol = await loop.connect_write_pipe(
            lambda: asyncio.StreamReaderProtocol(asyncio.StreamReader()), process.stdin
        )
        worker = cls(process, reader, read_transport, asyncio.StreamWriter(transport, protocol, None, loop))
        try:
            async with asyncio.timeout(START_TIMEOUT_S):
                await worker._read_frame()
        except (TimeoutError, WorkerGone):
            await worker.kill()
            raise GatewayError(ErrorCode.UNAVAILABLE, "the extraction worker did not start") from None
        return worker

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    async def _read_frame(self) -> bytes:
        try:
            (size,) = FRAME.unpack(await self.reader.readexactly(FRAME.size))
            if size > MAX_ANSWER_BYTES:
                raise WorkerGone(f"answer of {size} bytes")
            return await self.reader.readexactly(size)
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            raise WorkerGone(str(exc)) from None

    async def convert(self, job: tuple[bytes, bytes]) -> dict[str, Any]:
        head, body = job
        try:
            self.writer.write(head)
            # In slices, each written when the pipe takes it: one 2 MiB write() copied the whole
            # body into the transport's buffer (and faulted in its pages) in one loop step.
            view = memoryview(body)
            for start in range(0, len(body), WRITE_SLICE_BYTES):
                self.writer.write(view[start : start + WRITE_SLICE_BYTES])
                await self.writer.drain()
            await self.writer.drain()
        except ConnectionError as exc:
            raise WorkerGone(str(exc)) from None
        answer = await self._read_frame()
        try:
            decoded: dict[str, Any] = orjson.loads(answer)
        except orjson.JSONDecodeError:
            raise WorkerGone("malformed answer") from None
        return decoded

    def cpu_seconds(self) -> float | None:
        """CPU time the worker has used so far (user + system), None where /proc cannot tell."""
        try:
            fields = Path(f"/proc/{self.process.pid}/stat").read_bytes().rsplit(b")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS_PER_S
        except (OSError, ValueError, IndexError):
            return None

    async def convert_within(self, job: tuple[bytes, bytes], limit_s: float) -> dict[str, Any]:
        """`convert`, or TimeoutError once the job has used `limit_s` of the worker's CPU time.

        CPU time, not wall time: the worker runs niced, and on a busy node a page that needs half
        a second of CPU can wait many seconds for it; only a page that burns the CPU is a bomb.
        Where /proc is missing the limit is wall time. The fetch's own deadline bounds the wait.
        """
        started = self.cpu_seconds()
        if started is None:
            async with asyncio.timeout(limit_s):
                return await self.convert(job)
        job_task = spawn(self.convert(job), name="extraction-job")
        try:
            while True:
                done, _ = await asyncio.wait({job_task}, timeout=CPU_POLL_S)
                if done:
                    return job_task.result()
                used = self.cpu_seconds()
                if used is None or used - started > limit_s:
                    raise TimeoutError
        finally:
            if not job_task.done():
                job_task.cancel()
                with contextlib.suppress(asyncio.CancelledError, WorkerGone):
                    await job_task

    async def exit_status(self, wait_s: float) -> int | None:
        """The worker's exit status once it has exited (negative: the signal), None if it lives on."""
        try:
            return await asyncio.to_thread(self.process.wait, wait_s)
        except subprocess.TimeoutExpired:
            return None

    def _close_pipes(self) -> None:
        # Through the transports, which own the pipes: closing a pipe's file under a live
        # transport leaves its fd number registered with the loop, and the next pipe gets it.
        self.writer.close()
        self.read_transport.close()

    async def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.process.kill()
        self._close_pipes()
        await asyncio.to_thread(self.process.wait)

    async def retire(self) -> None:
        """End of input: the worker exits by itself; killed if it does not."""
        self.writer.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            await asyncio.to_thread(self.process.wait, RETIRE_TIMEOUT_S)
        await self.kill()


def _job(
    body: bytes,
    content_type: str | None,
    status: int,
    headers: Mapping[str, str],
    base_url: str,
    *,
    limits: RenderLimits,
) -> tuple[bytes, bytes]:
    """The job's frame head (length, header length, header) and its body, sent apart."""
    header = orjson.dumps(
        {
            "content_type": content_type,
            "status": status,
            "headers": dict(headers),
            "base_url": base_url,
            "limits": limits.to_wire(),
        }
    )
    size = FRAME.size + len(header) + len(body)
    return FRAME.pack(size) + FRAME.pack(len(header)) + header, body


def _worker_gone_error(returncode: int | None) -> GatewayError:
    """What a worker that died mid-job says about the page. Every Python error is answered inside
    the worker, so a death is native: killed by a signal means the page exhausted what the worker
    may use (an allocation over its address-space cap aborts, the kernel kills a runaway, a stack
    overflow faults): a bomb, `too_large` as documented. Anything else is an unreadable page."""
    if returncode is not None and returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return GatewayError(
            ErrorCode.TOO_LARGE,
            f"the page needs more memory or stack than the converter may use (the converter died of {name})",
        )
    return GatewayError(ErrorCode.UNSUPPORTED_CONTENT, "the page could not be converted (the converter exited)")


class ExtractionPool:
    def __init__(self, workers: int = DEFAULT_WORKERS, *, idle_exit_s: float = DEFAULT_IDLE_EXIT_S) -> None:
        self._workers = max(1, workers)
        self._idle_exit_s = idle_exit_s
        self._idle: list[ExtractionWorker] = []
        self._busy: set[ExtractionWorker] = set()
        self._slots: asyncio.Semaphore | None = None
        self._closed = False

    @property
    def live_workers(self) -> int:
        return len(self._idle) + len(self._busy)

    async def render(
        self,
        body: bytes,
        content_type: str | None,
        status: int,
        headers: Mapping[str, str],
        base_url: str,
        *,
        limits: RenderLimits,
        time_limit_s: float = DEFAULT_TIME_LIMIT_S,
    ) -> RenderedPage:
        if len(body) <= INLINE_MAX_BYTES and not is_pdf(body, content_type):
            return render_page(body, content_type, status, headers, base_url, limits=limits)
        if self._closed:
            raise GatewayError(ErrorCode.UNAVAILABLE, "the gateway is shutting down")
        if self._slots is None:
            self._slots = asyncio.Semaphore(self._workers)
        job = _job(body, content_type, status, headers, base_url, limits=limits)
        async with self._slots:
            worker = await self._take()
            try:
                answer = await worker.convert_within(job, time_limit_s)
            except TimeoutError:
                await self._discard(worker)
                raise GatewayError(
                    ErrorCode.TOO_LARGE,
                    f"conversion time cap hit: the page took over {time_limit_s:g} CPU seconds to convert",
                ) from None
            except WorkerGone:
                # How it ended, read before the discard kills it: our own SIGKILL says nothing.
                returncode = await worker.exit_status(EXIT_STATUS_WAIT_S)
                await self._discard(worker)
                raise _worker_gone_error(returncode) from None
            except BaseException:
                # Cancelled mid-job (the fetch deadline, a client gone): the worker is still busy
                # with a page nobody waits for, and may be a bomb; replace it.
                await asyncio.shield(self._discard(worker))
                raise
            self._release(worker)
        return RenderedPage.from_wire(answer)

    async def _take(self) -> ExtractionWorker:
        while self._idle:
            worker = self._idle.pop()
            if worker.idle_timer is not None:
                worker.idle_timer.cancel()
                worker.idle_timer = None
            if worker.alive:
                self._busy.add(worker)
                return worker
        worker = await ExtractionWorker.start()
        if self._closed:
            await worker.kill()
            raise GatewayError(ErrorCode.UNAVAILABLE, "the gateway is shutting down")
        self._busy.add(worker)
        return worker

    def _release(self, worker: ExtractionWorker) -> None:
        self._busy.discard(worker)
        self._idle.append(worker)
        worker.idle_timer = asyncio.get_running_loop().call_later(self._idle_exit_s, self._idle_exit, worker)

    def _idle_exit(self, worker: ExtractionWorker) -> None:
        if worker in self._idle:
            self._idle.remove(worker)
            spawn(worker.retire(), name="extraction-worker-retire")

    async def _discard(self, worker: ExtractionWorker) -> None:
        self._busy.discard(worker)
        await worker.kill()

    async def close(self) -> None:
        self._closed = True
        workers = [*self._idle, *self._busy]
        self._idle.clear()
        self._busy.clear()
        for worker in workers:
            if worker.idle_timer is not None:
                worker.idle_timer.cancel()
        await asyncio.gather(*(worker.kill() for worker in workers), return_exceptions=True)
