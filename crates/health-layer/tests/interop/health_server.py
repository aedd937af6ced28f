"""grpcio's official health servicer on 127.0.0.1, for health-layer's interop test.

Prints the port it bound, then reads commands on stdin, one per line, answering "ok" to each:

    set <service> <SERVING|NOT_SERVING|UNKNOWN>    ("-" is the empty service name, the server)
    quit
"""

import sys
from concurrent import futures

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc


def main():
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
    servicer = health.HealthServicer(
        experimental_non_blocking=True,
        experimental_thread_pool=futures.ThreadPoolExecutor(max_workers=4),
    )
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    print(port, flush=True)

    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        if words[0] == "quit":
            break
        if words[0] == "set" and len(words) == 3:
            service = "" if words[1] == "-" else words[1]
            status = health_pb2.HealthCheckResponse.ServingStatus.Value(words[2])
            servicer.set(service, status)
            print("ok", flush=True)
        else:
            print("error: unknown command " + line.strip(), flush=True)
    server.stop(0)


if __name__ == "__main__":
    main()
