"""A grpcio test server for stop_reaction.py (its `grpcio` backends): answers /gck.test.v1.TestService/Unary with its
request, and grpc.health.v1 with SERVING. Binds 127.0.0.1 on any port, prints "ready <port>".
SIGTERM stops it gracefully (server.stop with a 0.5 s grace); SIGKILL is the abrupt stop."""

import signal
import threading
from concurrent import futures

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc


def main():
    handler = grpc.method_handlers_generic_handler(
        "gck.test.v1.TestService",
        {"Unary": grpc.unary_unary_rpc_method_handler(lambda req, ctx: req)},
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    server.add_generic_rpc_handlers((handler,))
    checker = health.HealthServicer()
    checker.set("", health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(checker, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    done = threading.Event()

    def term(*_):
        server.stop(0.5)
        done.set()

    signal.signal(signal.SIGTERM, term)
    print(f"ready {port}", flush=True)
    done.wait()
    server.wait_for_termination(timeout=2)


if __name__ == "__main__":
    main()
