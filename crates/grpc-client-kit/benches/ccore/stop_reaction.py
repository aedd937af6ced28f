"""What gRPC's own C-core client (grpcio) loses when one of three backends stops under a
sequential caller: the baseline for the kit's reaction benchmark (BENCHMARKS.md).

    cargo build --release -p test-backends --example backends
    .venv/bin/python crates/grpc-client-kit/benches/ccore/stop_reaction.py \
        [abrupt|graceful] [trials] [tonic|grpcio]

(`.ci/run` creates `.venv` with grpcio and grpcio-health-checking.) A channel over three
backends with round_robin and client-side health checking (the Watch stream, as C-core does
it); 30 warm-up calls; then calls back to back for 1.5 s, backend 1 stopped 0.3 s in.

* `tonic` (default): the kit's own test backends, in one process (test-backends' `backends`
  example, driven over stdin): `abrupt` is its `stop` (every connection reset), `graceful` its
  `stop_graceful` with 500 ms grace (GOAWAY, calls in flight drain, the port refusing at once)
  — the same work as the sequential rows of `cargo bench -p grpc-client-kit --bench reaction`.
* `grpcio`: three grpcio server processes (server.py): `abrupt` is SIGKILL, `graceful`
  SIGTERM (grpcio's `server.stop(0.5)`).

The channel's default authority is set to `localhost`: for a multi-address `ipv4:` target
C-core would send the whole address list as `:authority`, which hyper's server rejects as a
malformed header (RST_STREAM PROTOCOL_ERROR on every call).

Prints, per trial, the calls made and each failure: when it started relative to the stop, its
code and message.
"""

import json
import os
import signal
import subprocess
import sys
import threading
import time

import grpc

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", "..", "..", ".."))


class TonicBackends:
    """test-backends' `backends` example: three tonic backends, driven over stdin."""

    def __init__(self):
        binary = os.path.join(ROOT, "target", "release", "examples", "backends")
        if not os.path.exists(binary):
            sys.exit(f"{binary} is missing: cargo build --release -p test-backends --example backends")
        self.proc = subprocess.Popen(
            [binary, "3"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        self.ports = [int(p) for p in self.proc.stdout.readline().split()[1:]]

    def command(self, line):
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        reply = self.proc.stdout.readline().strip()
        if not reply.startswith("ok"):
            raise RuntimeError(f"{line}: {reply}")

    def stop(self, mode):
        self.command("stop 1" if mode == "abrupt" else "stop_graceful 1 500")

    def after(self):
        self.command("restart 1")

    def close(self):
        self.proc.stdin.close()
        self.proc.wait()


class GrpcioBackends:
    """Three grpcio server processes (server.py)."""

    def __init__(self):
        self.procs = [
            subprocess.Popen(
                [sys.executable, os.path.join(HERE, "server.py")],
                stdout=subprocess.PIPE,
                text=True,
            )
            for _ in range(3)
        ]
        self.ports = [int(p.stdout.readline().split()[1]) for p in self.procs]

    def stop(self, mode):
        self.procs[1].send_signal(signal.SIGKILL if mode == "abrupt" else signal.SIGTERM)

    def after(self):
        self.close()

    def close(self):
        for p in self.procs:
            p.kill()
            p.wait()


def trial(mode, backends):
    try:
        ports = backends.ports
        config = {
            "loadBalancingConfig": [{"round_robin": {}}],
            "healthCheckConfig": {"serviceName": ""},
        }
        target = "ipv4:" + ",".join(f"127.0.0.1:{port}" for port in ports)
        channel = grpc.insecure_channel(
            target,
            options=[
                ("grpc.service_config", json.dumps(config)),
                ("grpc.default_authority", "localhost"),
            ],
        )
        call = channel.unary_unary("/gck.test.v1.TestService/Unary")
        for _ in range(30):
            call(b"", timeout=5)
        start = time.monotonic()
        stop_at = None
        failures = []
        calls = 0
        stopper = None
        while time.monotonic() - start < 1.5:
            if stop_at is None and time.monotonic() - start > 0.3:
                stop_at = time.monotonic()
                stopper = threading.Thread(target=backends.stop, args=(mode,))
                stopper.start()
            began = time.monotonic()
            try:
                call(b"", timeout=5)
            except grpc.RpcError as e:
                after_ms = (began - stop_at) * 1e3 if stop_at else float("nan")
                failures.append(f"{after_ms:+.2f} ms {e.code().name} {e.details()[:70]!r}")
            calls += 1
        stopper.join()
        channel.close()
        return calls, failures
    finally:
        backends.after()


def main():
    mode = sys.argv[1] if len(sys.argv) > 1 else "abrupt"
    trials = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    servers = sys.argv[3] if len(sys.argv) > 3 else "tonic"
    if mode not in ("abrupt", "graceful") or servers not in ("tonic", "grpcio"):
        sys.exit("usage: stop_reaction.py [abrupt|graceful] [trials] [tonic|grpcio]")
    print(
        f"grpcio {grpc.__version__} (C-core), round_robin with health checking, sequential "
        f"caller, {mode} stop, {servers} backends, {trials} trials"
    )
    total = 0
    tonic = TonicBackends() if servers == "tonic" else None
    try:
        for i in range(trials):
            calls, failures = trial(mode, tonic or GrpcioBackends())
            total += len(failures)
            print(f"trial {i}: {calls} calls, {len(failures)} failed {failures}")
    finally:
        if tonic:
            tonic.close()
    print(f"mean failed calls per trial: {total / trials:.1f}")


if __name__ == "__main__":
    main()
