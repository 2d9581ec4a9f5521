"""A class from one laptop: N viewers on the simulated H100 demo, what each gets, and what
the engine and the server pay for them.

It starts ``minicb demo --simulate GPU:MODEL`` on a loopback port (its own process) twice,
lets it run alone for ``--warmup`` seconds, then watches it for ``--seconds`` seconds with
no viewer, and the second time with ``--viewers`` plain WebSocket clients on ``/ws``:

- per viewer: frames and bytes a second, on the wire (a frame is zlib-compressed JSON in a
  binary message, compressed once by the server for every viewer; no permessage-deflate)
  and decoded (as the page inflates them), the largest message, and whether it was
  disconnected; and the loopback's bytes over the viewers, a cross-check of the wire;
- the engine: iterations a second (``minicb:iterations_total`` on /metrics) over the same
  window of the demo's life in two runs, one with no viewer and one with the viewers (the
  simulated engines are paced to the wall clock: an engine that keeps up steps alike);
- the server process: CPU seconds a wall second (from /proc, the server process alone),
  with and without viewers, in all and in its main thread alone (the asyncio loop: the
  frames' folding, compression and every socket write; the engine runs in its own
  thread), and so the server's CPU per viewer; its resident memory every 10 s. On a busy
  machine (the viewers run on it too) the engine thread takes what CPU it is given, so the
  loop thread's share, which the viewers' frames set, is the figure to read per viewer.

Loopback only, bounded in count (at most 500 viewers) and time (at most 15 minutes), and it
stops the demo it started. A benchmark, not a test:

    python scripts/viewer_load.py --viewers 200 --seconds 300
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import statistics
import subprocess
import sys
import time
import urllib.request
import zlib
from dataclasses import dataclass, field

import psutil
import websockets

MAX_VIEWERS, MAX_SECONDS = 500, 900


@dataclass
class Viewer:
    frames: int = 0
    bytes: int = 0  # as received: compressed frames, text as it is
    decoded: int = 0  # frames inflated
    views: int = 0  # views instead of a backlog: the server found this viewer behind
    largest: int = 0
    closed: str | None = None  # why it was disconnected, if it was
    frame_times: list[float] = field(default_factory=list)


async def watch(url: str, viewer: Viewer, until: float, origin: str) -> None:
    try:
        # No keepalive pings of the client's own: a browser sends none (the server pings,
        # and closes a viewer that does not answer); on a busy machine the clients'
        # own pings timed out and closed all 200 (1011, keepalive ping timeout).
        async with websockets.connect(
            url, max_size=None, compression=None, origin=origin, open_timeout=60,
            ping_interval=None,
        ) as ws:  # fmt: skip
            while time.monotonic() < until:
                try:
                    message = await asyncio.wait_for(ws.recv(), until - time.monotonic())
                except TimeoutError:
                    break
                size = len(message)
                viewer.largest = max(viewer.largest, size)
                viewer.bytes += size
                if isinstance(message, bytes):  # a frame, a view or the hello, compressed
                    text = zlib.decompress(message)
                    viewer.decoded += len(text)
                    if text.startswith(b'{"type": "frame"'):  # json.dumps's own spacing
                        viewer.frames += 1
                        viewer.frame_times.append(time.monotonic())
                    elif text.startswith(b'{"type": "view"'):
                        viewer.views += 1
                else:
                    viewer.decoded += len(message.encode())
    except Exception as err:  # a refused or dropped connection is a result, not a crash
        viewer.closed = f"{type(err).__name__}: {err}"


def iterations(base: str) -> float:
    text = urllib.request.urlopen(base + "/metrics", timeout=30).read().decode()
    found = re.search(r"^minicb:iterations_total(?:\{[^}]*\})? ([0-9.e+]+)$", text, re.M)
    return float(found.group(1)) if found else float("nan")


def sample(proc: psutil.Process, base: str) -> tuple[float, float, float, float]:
    """(wall time, server CPU seconds, engine iterations, main thread's CPU seconds) now;
    iterations NaN when the server did not answer /metrics within 30 s (a result: it was
    too busy to serve)."""
    cpu = proc.cpu_times()
    main = next((t.user_time + t.system_time for t in proc.threads() if t.id == proc.pid), 0)
    try:
        done = iterations(base)
    except OSError:  # a timeout included
        done = float("nan")
    return time.monotonic(), cpu.user + cpu.system, done, main


def rates(marks: list[tuple]) -> tuple[float, float, float]:
    """Server CPU a wall second, iterations a second (over the answered samples; NaN with
    fewer than two), and the main thread's CPU a wall second."""
    answered = [m for m in marks if m[2] == m[2]]  # NaN != NaN
    a, b = marks[0], marks[-1]
    wall = b[0] - a[0]
    done = answered[-1][2] - answered[0][2] if len(answered) > 1 else float("nan")
    span = answered[-1][0] - answered[0][0] if len(answered) > 1 else 1.0
    return (b[1] - a[1]) / wall, done / span, (b[3] - a[3]) / wall


def start(args: argparse.Namespace) -> tuple[subprocess.Popen, psutil.Process, str]:
    """The demo in its own process, answering on /metrics; the caller stops it."""
    base = f"http://127.0.0.1:{args.port}"
    command = [sys.executable, "-m", "minicb.cli", "demo", "--simulate", args.simulate,
               "--no-wait-for-page", "--host", "127.0.0.1", "--port", str(args.port)]  # fmt: skip
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(600):  # the server's start, bounded
        try:
            iterations(base)
            break
        except OSError:
            time.sleep(0.5)
    return server, psutil.Process(server.pid), base


def stop(server: subprocess.Popen) -> None:
    server.terminate()
    try:
        server.wait(20)
    except subprocess.TimeoutExpired:
        server.kill()


def run_phase(args: argparse.Namespace, num_viewers: int) -> dict:
    """A fresh demo, ``--warmup`` seconds alone, then ``--seconds`` with ``num_viewers``
    viewers: the same workload over the same window of its life in either phase."""
    server, proc, base = start(args)
    try:
        time.sleep(args.warmup)
        viewers = [Viewer() for _ in range(num_viewers)]
        until = time.monotonic() + args.seconds
        url = base.replace("http", "ws") + "/ws"

        wire = psutil.net_io_counters(pernic=True)["lo"].bytes_sent

        async def run() -> tuple[list, list]:
            tasks = [asyncio.create_task(watch(url, v, until, base)) for v in viewers]
            # in a thread: a slow /metrics must not stop these viewers from reading
            marks, rss = [await asyncio.to_thread(sample, proc, base)], [proc.memory_info().rss]
            while time.monotonic() < until - 1:
                await asyncio.sleep(min(10.0, until - 1 - time.monotonic()))
                marks.append(await asyncio.to_thread(sample, proc, base))
                rss.append(proc.memory_info().rss)
            await asyncio.gather(*tasks)
            return marks, rss

        marks, rss = asyncio.run(run())
        wire = psutil.net_io_counters(pernic=True)["lo"].bytes_sent - wire
    finally:
        stop(server)
    cpu, rate, loop_cpu = rates(marks)
    out = {"viewers": num_viewers, "iterations_per_s": rate, "server_cpu": cpu,
           "server_loop_cpu": loop_cpu,
           "server_rss_mb": [round(r / 2**20) for r in rss],
           "metrics_unanswered": sum(m[2] != m[2] for m in marks)}  # fmt: skip
    if viewers:
        settled = args.seconds - min(20.0, args.seconds / 4)  # after everyone connected
        first = until - settled
        fps = [sum(t >= first for t in v.frame_times) / settled for v in viewers]
        kbps = [v.bytes / args.seconds / 1e3 for v in viewers]  # on the wire
        decoded = [v.decoded / args.seconds / 1e3 for v in viewers]  # as the page reads it
        # The loopback (everything this machine sent there, both ways, TCP included): a
        # cross-check of the messages' bytes; the client's own traffic is small beside it.
        out["loopback_kbytes_per_s_per_viewer"] = wire / args.seconds / 1e3 / len(viewers)
        out.update(
            frames_per_s_min=min(fps), frames_per_s_median=statistics.median(fps),
            kbytes_per_s_median=statistics.median(kbps), kbytes_per_s_max=max(kbps),
            decoded_kbytes_per_s_median=statistics.median(decoded),
            views_median=statistics.median(v.views for v in viewers),
            largest_message_kbytes=max(v.largest for v in viewers) / 1e3,
            disconnected=sum(v.closed is not None for v in viewers),
            first_disconnection=next((v.closed for v in viewers if v.closed), None),
        )  # fmt: skip
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--viewers", type=int, default=200)
    ap.add_argument("--seconds", type=float, default=300)
    ap.add_argument("--warmup", type=float, default=20, help="seconds with no viewer first")
    ap.add_argument("--port", type=int, default=8790)
    ap.add_argument("--simulate", default="H100:llama-3.1-8b")
    args = ap.parse_args()
    if not 1 <= args.viewers <= MAX_VIEWERS or not 1 <= args.seconds <= MAX_SECONDS:
        sys.exit(f"at most {MAX_VIEWERS} viewers and {MAX_SECONDS} seconds")
    alone, watched = run_phase(args, 0), run_phase(args, args.viewers)
    ratio = watched["iterations_per_s"] / alone["iterations_per_s"]
    # The key figure: what each viewer costs the server (its clients run on this machine
    # too, so the server's CPU is read alone, and the difference is the viewers' share).
    # The loop thread's share includes folding each engine's events, once whatever the
    # number of viewers: per viewer, an upper bound.
    per_viewer = (watched["server_cpu"] - alone["server_cpu"]) / args.viewers
    loop_per_viewer = (watched["server_loop_cpu"] - alone["server_loop_cpu"]) / args.viewers
    result = {"alone": alone, "watched": watched, "step_rate_ratio": ratio,
              "server_cpu_per_viewer": per_viewer,
              "server_loop_cpu_per_viewer": loop_per_viewer}  # fmt: skip
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
