"""A gRPC C-core test backend (Python grpcio) for grpc-client-kit's interop tests.

Serves gck.test.v1.TestService (messages hand-encoded below: there is no .proto file) and,
unless --no-health, grpcio's official grpc.health.v1 servicer. Driven over stdin/stdout by
tests/interop/support/mod.rs; the protocol is the same for every implementation:

    ready <port>                      printed once serving
    health <service|-> <STATUS>       STATUS: SERVING, NOT_SERVING, UNKNOWN, SERVICE_UNKNOWN
    fail <n> <code>                   the next n Unary calls fail with <code>, "injected failure"
    delay <ms>                        every TestService call waits this long first (0: off)
    hits                              -> ok <Unary calls received>
    stop <grace_ms>                   graceful stop; answers once stopped, then exits 0

Each command is answered with one line: "ok", "ok <value>" or "error: <why>". Closing stdin ends
the process at once. A server setting given on the command line is passed to C-core as the
channel argument named in SETTINGS; C-core honours them all.
"""

import argparse
import os
import sys
import threading
import time
from concurrent import futures

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

SERVICE = "gck.test.v1.TestService"

# (command-line flag, C-core channel argument, smallest accepted value)
SETTINGS = [
    ("max_connection_age_ms", "grpc.max_connection_age_ms", 1),
    ("max_connection_age_grace_ms", "grpc.max_connection_age_grace_ms", 1),
    ("max_connection_idle_ms", "grpc.max_connection_idle_ms", 1),
    ("min_ping_interval_ms", "grpc.http2.min_ping_interval_without_data_ms", 1),
    # C-core reads 0 strikes as "unlimited" (never GOAWAY): refused, so that nobody believes
    # a zero-tolerance policy is active.
    ("max_ping_strikes", "grpc.http2.max_ping_strikes", 1),
]


# ----- protobuf wire format, by hand -----


def encode_varint(n):
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def decode_varint(data, i):
    shift = 0
    value = 0
    while True:
        if i >= len(data):
            raise ValueError("truncated varint")
        byte = data[i]
        i += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, i
        shift += 7
        if shift >= 64:
            raise ValueError("varint too long")


def fields(data):
    """Yields (field number, value) of a message: an int for a varint, bytes for a
    length-delimited field; fixed-width fields are skipped."""
    i = 0
    while i < len(data):
        key, i = decode_varint(data, i)
        number, wire_type = key >> 3, key & 7
        if wire_type == 0:
            value, i = decode_varint(data, i)
            yield number, value
        elif wire_type == 2:
            length, i = decode_varint(data, i)
            if i + length > len(data):
                raise ValueError("truncated field")
            yield number, data[i : i + length]
            i += length
        elif wire_type == 1:
            i += 8
        elif wire_type == 5:
            i += 4
        else:
            raise ValueError("unsupported wire type %d" % wire_type)


def decode_ping(data):
    """Ping { string payload = 1; } -> the payload."""
    payload = ""
    for number, value in fields(data):
        if number == 1 and isinstance(value, bytes):
            payload = value.decode("utf-8")
    return payload


def decode_stream_ping(data):
    """StreamPing { uint32 count = 1; } -> the count."""
    count = 0
    for number, value in fields(data):
        if number == 1 and isinstance(value, int):
            count = value & 0xFFFFFFFF
    return count


def encode_string(number, text):
    raw = text.encode("utf-8")
    if not raw:
        return b""
    return encode_varint(number << 3 | 2) + encode_varint(len(raw)) + raw


def encode_pong(pong):
    """Pong { string backend = 1; uint64 seq = 2; string payload = 3; } from a tuple."""
    backend, seq, payload = pong
    out = encode_string(1, backend)
    if seq:
        out += encode_varint(2 << 3 | 0) + encode_varint(seq)
    return out + encode_string(3, payload)


# ----- the test service -----


class TestService:
    def __init__(self, name):
        self.name = name
        self.lock = threading.Lock()
        self.hits = 0
        self.fail_remaining = 0
        self.fail_code = None
        self.delay = 0.0

    def unary(self, payload, context):
        with self.lock:
            self.hits += 1
            seq = self.hits
            failure = None
            if self.fail_remaining > 0:
                self.fail_remaining -= 1
                failure = self.fail_code
            delay = self.delay
        if delay:
            time.sleep(delay)
        if failure is not None:
            context.abort(failure, "injected failure")
        return (self.name, seq, payload)

    def server_stream(self, count, context):
        with self.lock:
            delay = self.delay
        if delay:
            time.sleep(delay)
        for seq in range(count):
            yield (self.name, seq, "")

    def handler(self):
        return grpc.method_handlers_generic_handler(
            SERVICE,
            {
                "Unary": grpc.unary_unary_rpc_method_handler(
                    self.unary,
                    request_deserializer=decode_ping,
                    response_serializer=encode_pong,
                ),
                "ServerStream": grpc.unary_stream_rpc_method_handler(
                    self.server_stream,
                    request_deserializer=decode_stream_ping,
                    response_serializer=encode_pong,
                ),
            },
        )


STATUS_CODES = {code.value[0]: code for code in grpc.StatusCode}


# ----- the control protocol -----


def run_command(words, service, servicer, server):
    """Returns the answer line, and whether the process should exit after it."""
    if not words:
        return "error: empty command", False
    command, args = words[0], words[1:]
    if command == "health" and len(args) == 2:
        if servicer is None:
            return "error: started with --no-health", False
        service_name = "" if args[0] == "-" else args[0]
        try:
            status = health_pb2.HealthCheckResponse.ServingStatus.Value(args[1])
        except ValueError:
            return "error: unknown status %s" % args[1], False
        servicer.set(service_name, status)
        return "ok", False
    if command == "fail" and len(args) == 2:
        n, code = int(args[0]), int(args[1])
        if n < 0 or code not in STATUS_CODES or (n > 0 and code == 0):
            return "error: fail wants n >= 0 and a failure code 1..16", False
        with service.lock:
            service.fail_remaining = n
            service.fail_code = STATUS_CODES[code]
        return "ok", False
    if command == "delay" and len(args) == 1:
        ms = int(args[0])
        if ms < 0:
            return "error: delay wants ms >= 0", False
        with service.lock:
            service.delay = ms / 1000.0
        return "ok", False
    if command == "hits" and not args:
        with service.lock:
            return "ok %d" % service.hits, False
    if command == "stop" and len(args) == 1:
        grace_ms = int(args[0])
        # Stops listening at once, GOAWAY on every connection, in-flight calls may finish
        # within the grace; the event is set once everything is closed.
        server.stop(grace_ms / 1000.0).wait()
        return "ok", True
    return "error: unknown command %s" % " ".join(words), False


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--name", default="b0")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--no-health", action="store_true")
    for flag, _, _ in SETTINGS:
        parser.add_argument("--" + flag.replace("_", "-"), type=int, dest=flag)
    parser.add_argument("--permit-without-calls", action="store_true")
    return parser.parse_args()


def main():
    args = parse_args()
    # A restart binds the same port again: SO_REUSEADDR is C-core's default; SO_REUSEPORT is
    # turned off so that a second live server on the port is an error, not a silent share.
    options = [("grpc.so_reuseport", 0)]
    for flag, channel_arg, smallest in SETTINGS:
        value = getattr(args, flag)
        if value is None:
            continue
        if value < smallest:
            sys.stderr.write(
                "C-core backend: --%s %d refused: the smallest value it honours is %d%s\n"
                % (
                    flag.replace("_", "-"),
                    value,
                    smallest,
                    " (C-core reads 0 as unlimited strikes)"
                    if flag == "max_ping_strikes"
                    else "",
                )
            )
            sys.exit(2)
        options.append((channel_arg, value))
    if args.permit_without_calls:
        options.append(("grpc.keepalive_permit_without_calls", 1))

    service = TestService(args.name)
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=32),
        handlers=[service.handler()],
        options=options,
    )
    servicer = None
    if not args.no_health:
        servicer = health.HealthServicer(
            experimental_non_blocking=True,
            experimental_thread_pool=futures.ThreadPoolExecutor(max_workers=4),
        )
        health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
        servicer.set("", health_pb2.HealthCheckResponse.SERVING)
        servicer.set(SERVICE, health_pb2.HealthCheckResponse.SERVING)
    try:
        port = server.add_insecure_port("127.0.0.1:%d" % args.port)
    except RuntimeError as error:
        port = 0
        sys.stderr.write("C-core backend: %s\n" % error)
    if not port:
        sys.stderr.write("C-core backend: cannot bind 127.0.0.1:%d\n" % args.port)
        sys.exit(1)
    server.start()
    print("ready %d" % port, flush=True)

    for line in sys.stdin:
        try:
            answer, done = run_command(line.split(), service, servicer, server)
        except ValueError as error:
            answer, done = "error: %s" % error, False
        print(answer, flush=True)
        if done:
            os._exit(0)
    # stdin closed: exit at once, without waiting for calls or threads.
    os._exit(0)


if __name__ == "__main__":
    main()
