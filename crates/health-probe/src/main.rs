//! `grpc-health-probe`: a drop-in for `grpc_health_probe`. See the `health-probe` crate docs.

fn main() -> std::process::ExitCode {
    health_probe::main_with_args(std::env::args_os().skip(1))
}
