"""One gRPC call through the delaying relay: how many round trips does a message of N bytes cost?

    sudo .venv/bin/python benchmarks/bench_relay_rpc.py [--delay 5] [--calls 60]   # ~1 min; needs root

Issue 29 (latency): tests whether gRPC's HTTP/2 flow control (a 64 KB stream
window at first, grown by BDP probing) makes a psflow-sized message (a sparse-LR
PushPull: ~107 KB request, ~21 KB reply) wait for window updates, i.e. more
than one round trip. Two namespaces (tests/netns.py), a plain gRPC unary method
(REQ bytes in, REP bytes out, no work) in one, the client in the other,
every byte through the relay at ``--delay`` ms each way. For each variant of
channel and server options (the same on both sides) and each size, a fresh
server and a fresh client process: the first ``--first`` calls on the new
channel (where windows start small), then the median and p90 of the rest.
Variants: ``default`` (gRPC's defaults, as psflow sets them today),
``bdp_off`` (``grpc.http2.bdp_probe`` 0: the window stays at 64 KB),
``bdp_off_la1M`` (no probing, ``grpc.http2.lookahead_bytes`` 1 MiB: a large
window from the start), ``la1M`` (probing and a 1 MiB window).

Writes benchmarks/results/relay_rpc_<D>ms.json (or ``--output FILE``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from concurrent import futures
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))

MAX = 1 << 28
BASE = [("grpc.max_send_message_length", MAX), ("grpc.max_receive_message_length", MAX)]
VARIANTS: dict[str, list[tuple[str, int]]] = {
    "default": [],
    "bdp_off": [("grpc.http2.bdp_probe", 0)],
    "bdp_off_la1M": [("grpc.http2.bdp_probe", 0), ("grpc.http2.lookahead_bytes", 1 << 20)],
    "la1M": [("grpc.http2.lookahead_bytes", 1 << 20)],
}
#: (request bytes, reply bytes): a tiny call, a sparse-LR PushPull to the ps holding the table, 4x that.
SIZES = [(1_000, 100), (107_000, 21_000), (400_000, 80_000)]
PORT = 2222


def _server(port: int, variant: str) -> None:
    import grpc

    def handler(request: bytes, context: Any) -> bytes:
        return b"\0" * int.from_bytes(request[:8], "little")

    server = grpc.server(futures.ThreadPoolExecutor(4), options=BASE + VARIANTS[variant])
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        "Bench", {"Call": grpc.unary_unary_rpc_method_handler(handler)}),))
    server.add_insecure_port(f"0.0.0.0:{port}")
    server.start()
    server.wait_for_termination()


def _client(address: str, variant: str, request: int, reply: int, calls: int, first: int) -> None:
    import grpc

    channel = grpc.insecure_channel(address, options=BASE + VARIANTS[variant])
    call = channel.unary_unary("/Bench/Call")
    call(b"\0" * 8, timeout=30, wait_for_ready=True)  # connected; no large message yet
    body = reply.to_bytes(8, "little") + b"\1" * max(0, request - 8)
    ms = []
    for _ in range(calls):
        t = time.perf_counter()
        call(body, timeout=30)
        ms.append((time.perf_counter() - t) * 1e3)
    rest = sorted(ms[first:])
    print(json.dumps({"first_ms": [round(x, 2) for x in ms[:first]], "median_ms": statistics.median(rest),
                      "p90_ms": rest[int(0.9 * (len(rest) - 1))]}))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--delay", type=float, default=5.0, help="one-way relay delay, ms (default 5: 10 ms round trips)")
    p.add_argument("--calls", type=int, default=60)
    p.add_argument("--first", type=int, default=5, help="calls reported one by one (the new channel's)")
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--output", metavar="FILE")
    args = p.parse_args(argv)
    from netns import NetnsLab, netns_available

    why = netns_available()
    if why is not None:
        print(f"bench_relay_rpc: {why}", file=sys.stderr)
        return 1
    rows = []
    me = os.path.abspath(__file__)
    with NetnsLab(["server", "client"]) as lab:
        lab.start_relay({"server": PORT}, delay=args.delay / 1000.0)
        address = f"{lab.hosts['server'].front}:{PORT}"
        for variant in args.variants.split(","):
            for request, reply in SIZES:
                server = lab.spawn("server", [sys.executable, me, "_server", str(PORT), variant])
                try:
                    done = subprocess.run(["ip", "netns", "exec", lab.hosts["client"].netns, sys.executable, me,
                                           "_client", address, variant, str(request), str(reply), str(args.calls),
                                           str(args.first)], capture_output=True, text=True, timeout=300)
                finally:  # only the server this loop started, by pid
                    os.killpg(server.pid, 9)
                    server.wait()
                if done.returncode != 0:
                    raise RuntimeError(f"client ({variant}, {request} B): {done.stderr[-2000:]}")
                row = {"variant": variant, "request_bytes": request, "reply_bytes": reply,
                       **json.loads(done.stdout.strip().splitlines()[-1])}
                rows.append(row)
                print(f"{variant:13s} {request:>8,} B -> {reply:>7,} B: first calls {row['first_ms']} ms, "
                      f"then median {row['median_ms']:.1f} ms, p90 {row['p90_ms']:.1f} ms", flush=True)
    result = {"delay_ms_one_way": args.delay, "round_trip_added_ms": 2 * args.delay, "calls": args.calls,
              "variants": {k: VARIANTS[k] for k in args.variants.split(",")}, "rows": rows,
              "cpus": os.cpu_count(), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    output = args.output or os.path.join(HERE, "results", f"relay_rpc_{args.delay:g}ms.json")
    with open(output, "w") as f:
        json.dump(result, f, indent=1)
    print(f"results: {output}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_server":
        _server(int(sys.argv[2]), sys.argv[3])
    elif len(sys.argv) > 1 and sys.argv[1] == "_client":
        _client(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]), int(sys.argv[7]))
    else:
        sys.exit(main())
