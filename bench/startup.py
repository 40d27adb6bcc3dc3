"""Start-up benchmark: time from exec to ready, for the gateway and a bare aiohttp server beside it.

Starts a real `python -m gateway serve` with default settings (the shipped default policy,
listeners on free loopback ports, the audit log to stdout, sent to /dev/null) RUNS times and
times each start from just before the exec until `/readyz` answers 200 with the proxy and the
tools API accepting connections. The reference is the smallest server the gateway could be: a
bare aiohttp application on uvloop answering `/readyz`, started the same way, alternating with
the gateway so both see the same neighbours. On a loaded machine both slow down; the ratio of
the medians is the figure that does not depend on the load. `python -c pass` is the
interpreter's own floor. A first start of each, not counted, writes the bytecode caches (the
image compiles them at build time).

    .venv/bin/python bench/startup.py --runs 9
    .venv/bin/python bench/startup.py --runs 3 --imports 25   # also the slowest imports of a start
    .venv/bin/python bench/startup.py --compare /tmp/before     # beside another checkout's gateway

`--imports N` adds one more start under `-X importtime` and prints the N modules with the
largest own (self) import time, and the own time summed per top-level package.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
POLL_INTERVAL_S = 0.003
READY_TIMEOUT_S = 30.0
TARGET_READY_S = 1.0

REFERENCE_SERVER = """
import sys, uvloop
from aiohttp import web
async def ready(_):
    return web.json_response({"ready": True})
app = web.Application()
app.router.add_get("/readyz", ready)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None, loop=uvloop.new_event_loop())
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def readyz_status(port: int) -> int:
    """The status of GET /readyz, 0 while nothing answers (a raw socket: the poller stays cheap)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2) as sock:
            sock.sendall(b"GET /readyz HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n")
            head = sock.recv(64)
    except OSError:
        return 0
    parts = head.split(b" ", 2)
    return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0


def accepts(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


@dataclass(frozen=True, slots=True)
class Start:
    """How to start one server: argv given its admin port, and the other ports that must accept."""

    name: str
    argv: Callable[[int], list[str]]
    env: Callable[[int, list[int]], dict[str, str]]
    extra_ports: int


def cpu_s(pid: int) -> float:
    """User plus system CPU seconds the process has used (utime and stime in /proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True, slots=True)
class Ready:
    wall_s: float
    cpu_s: float


def time_start(start: Start, workdir: Path) -> Ready:
    """From just before the exec until /readyz answers 200 and every listener accepts: the wall
    time, and the CPU time the server used to get there (which a busy machine barely changes)."""
    admin = free_port()
    extra = [free_port() for _ in range(start.extra_ports)]
    started = time.perf_counter()
    process = subprocess.Popen(
        start.argv(admin),
        env=start.env(admin, extra),
        cwd=workdir,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = started + READY_TIMEOUT_S
        while time.perf_counter() < deadline:
            if readyz_status(admin) == 200 and all(accepts(port) for port in extra):
                return Ready(time.perf_counter() - started, cpu_s(process.pid))
            if process.poll() is not None:
                raise RuntimeError(
                    f"{start.name} exited with {process.returncode}: {process.communicate()[1][-400:]!r}"
                )
            time.sleep(POLL_INTERVAL_S)
        raise RuntimeError(f"{start.name} not ready after {READY_TIMEOUT_S} s")
    finally:
        process.terminate()
        try:
            process.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()


def time_exit(argv: Sequence[str]) -> float:
    started = time.perf_counter()
    subprocess.run(argv, check=True)
    return time.perf_counter() - started


def base_env() -> dict[str, str]:
    # Not PYTHONDONTWRITEBYTECODE: the bytecode caches are written by the uncounted first start.
    return {"PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", "/tmp")}


def gateway_start(python: str, checkout: Path = REPO, name: str = "egress-gateway serve") -> Start:
    def env(admin: int, extra: list[int]) -> dict[str, str]:
        proxy, api = extra
        return {
            **base_env(),
            "EGRESS_POLICY": str(REPO / "policies" / "default.yaml"),
            "EGRESS_PROXY_LISTEN": f"127.0.0.1:{proxy}",
            "EGRESS_API_LISTEN": f"127.0.0.1:{api}",
            "EGRESS_ADMIN_LISTEN": f"127.0.0.1:{admin}",
            # Never asked during a start; a closed loopback port keeps any stray query on this machine.
            "EGRESS_NAMESERVERS": f"127.0.0.1:{free_port()}",
            "PYTHONPATH": str(checkout),
        }

    return Start(name, lambda _: [python, "-m", "gateway", "serve"], env, extra_ports=2)


def reference_start(python: str) -> Start:
    return Start(
        "bare aiohttp + uvloop /readyz",
        lambda admin: [python, "-c", REFERENCE_SERVER, str(admin)],
        lambda _admin, _extra: base_env(),
        extra_ports=0,
    )


def slowest_imports(python: str, workdir: Path, count: int) -> list[str]:
    """One gateway start under -X importtime: the `count` largest self times, and per package."""
    start = gateway_start(python)
    traced = Start(start.name, lambda _: [python, "-X", "importtime", "-m", "gateway", "serve"], start.env, 2)
    admin = free_port()
    proxy, api = free_port(), free_port()
    log = workdir / "importtime.txt"
    with log.open("wb") as stderr:
        process = subprocess.Popen(
            traced.argv(admin),
            env=traced.env(admin, [proxy, api]),
            cwd=workdir,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
        try:
            deadline = time.perf_counter() + READY_TIMEOUT_S
            while readyz_status(admin) != 200 and time.perf_counter() < deadline and process.poll() is None:
                time.sleep(POLL_INTERVAL_S)
        finally:
            process.terminate()
            process.wait(15)
    own: list[tuple[int, str]] = []
    packages: dict[str, int] = {}
    for line in log.read_text(errors="replace").splitlines():
        if not line.startswith("import time:") or "|" not in line or "imported package" in line:
            continue
        self_us, _cumulative_us, name = line.removeprefix("import time:").split("|")
        own.append((int(self_us), name.strip()))
        top = name.strip().split(".")[0]
        packages[top] = packages.get(top, 0) + int(self_us)
    lines = [f"{us / 1000:7.1f} ms  {name}" for us, name in sorted(own, reverse=True)[:count]]
    lines.append(f"modules imported: {len(own)}; own import time per top-level package (ms):")
    ranked = sorted(packages.items(), key=lambda item: -item[1])
    lines.append("  " + ", ".join(f"{name} {us / 1000:.1f}" for name, us in ranked[:count]))
    return lines


def summary(name: str, starts: list[Ready]) -> str:
    wall = [start.wall_s for start in starts]
    cpu = [start.cpu_s for start in starts]
    return (
        f"| {name} | {statistics.median(wall) * 1000:.0f} | {min(wall) * 1000:.0f} | {max(wall) * 1000:.0f} | "
        f"{statistics.median(cpu) * 1000:.0f} | {len(starts)} |"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=9, help="counted starts of each server (1-50)")
    parser.add_argument("--imports", type=int, default=0, help="also list the N slowest imports of one start")
    parser.add_argument("--python", default=sys.executable, help="interpreter (a venv with the dependencies)")
    parser.add_argument("--compare", type=Path, help="also start the gateway package of another checkout")
    args = parser.parse_args()
    runs = max(1, min(args.runs, 50))
    gateway, reference = gateway_start(args.python), reference_start(args.python)
    starts = [reference, gateway]
    if args.compare:
        starts.append(gateway_start(args.python, args.compare.resolve(), f"egress-gateway serve ({args.compare})"))
    interpreter: list[Ready] = []
    timings: dict[str, list[Ready]] = {start.name: [] for start in starts}
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="startup-") as tmp:
        workdir = Path(tmp)
        for start in starts:
            time_start(start, workdir)
        for _ in range(runs):
            interpreter.append(Ready(time_exit([args.python, "-c", "pass"]), 0.0))
            for start in starts:
                timings[start.name].append(time_start(start, workdir))
        imports = slowest_imports(args.python, workdir, args.imports) if args.imports else []
    load = os.getloadavg()
    print(f"load average {load_before:.2f} before, {load[0]:.2f} after; {os.cpu_count()} CPUs; {args.python}")
    print("| start → ready | median ms | min ms | max ms | CPU median ms | runs |")
    print("|---|---|---|---|---|---|")
    print(summary("python -c pass (exit)", interpreter))
    for name, recorded in timings.items():
        print(summary(name, recorded))
    ours = [start.wall_s for start in timings[gateway.name]]
    theirs = [start.wall_s for start in timings[reference.name]]
    our_cpu = statistics.median(start.cpu_s for start in timings[gateway.name])
    their_cpu = statistics.median(start.cpu_s for start in timings[reference.name])
    median = statistics.median(ours)
    verdict = "within" if median <= TARGET_READY_S else "OVER"
    print(
        f"gateway / reference: wall median {median / statistics.median(theirs):.2f}x, max "
        f"{max(ours) / max(theirs):.2f}x, CPU {our_cpu / max(their_cpu, 1e-9):.2f}x; gateway median "
        f"{median * 1000:.0f} ms, max {max(ours) * 1000:.0f} ms ({verdict} {TARGET_READY_S * 1000:.0f} ms)"
    )
    for line in imports:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
