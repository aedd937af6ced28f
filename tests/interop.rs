//! Interop: the same test backend on four gRPC server implementations (tonic, gRPC C-core,
//! grpc-go, grpc-js), driven through `support::InteropBackend`, checked with plain tonic clients
//! and a raw HTTP/2 probe.
//!
//! Every test that needs another implementation, and every soak, is ignored by default: run
//! `.ci/interop-setup` (or `.ci/run`), export what it prints, then
//! `cargo test --test interop -- --include-ignored`. The kit's scenarios on tonic backends (in
//! process) run with every `cargo test`.

#[path = "interop/controls.rs"]
mod controls;
#[path = "interop/matrix.rs"]
mod matrix;
#[path = "interop/production.rs"]
mod production;
#[path = "interop/service_config.rs"]
mod service_config;
#[path = "interop/support/mod.rs"]
mod support;

use support::Implementation;

/// The kit's scenarios and its idle soak, for one implementation, mode and settings.
macro_rules! kit_tests {
    ($name:ident, $imp:expr, $mode:ident, $settings:ident, [$($ignore:meta)?]) => {
        mod $name {
            use super::*;
            use crate::matrix::{Mode, Settings};

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            $(#[$ignore])?
            async fn kit() {
                crate::matrix::behaviour($imp, Mode::$mode, Settings::$settings).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            #[ignore = "a soak: run .ci/interop-setup (or .ci/run)"]
            async fn soak() {
                crate::matrix::soak($imp, Mode::$mode, Settings::$settings).await;
            }
        }
    };
}

macro_rules! interop_tests {
    ($($module:ident => $imp:expr, [$($ignore:meta)?]),* $(,)?) => {$(
        mod $module {
            use super::*;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            #[ignore = "needs the interop servers: run .ci/interop-setup (or .ci/run)"]
            async fn controls() {
                crate::controls::controls_work($imp).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            #[ignore = "needs the interop servers: run .ci/interop-setup (or .ci/run)"]
            async fn production_settings() {
                crate::production::production_settings_are_live($imp).await;
            }

            /// The kit configured only by a gRPC service config.
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            $(#[$ignore])?
            async fn service_config() {
                crate::service_config::configured_by_service_config($imp).await;
            }

            kit_tests!(watch_defaults, $imp, Watch, Defaults, [$($ignore)?]);
            kit_tests!(check_defaults, $imp, Check, Defaults, [$($ignore)?]);
            kit_tests!(watch_production, $imp, Watch, Production, [$($ignore)?]);
            kit_tests!(check_production, $imp, Check, Production, [$($ignore)?]);
        }
    )*};
}

/// Where servers enforce a ping policy.
macro_rules! keepalive_soak {
    ($($module:ident => $imp:expr),* $(,)?) => {$(
        mod $module {
            use super::*;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            #[ignore = "needs the interop servers: run .ci/interop-setup (or .ci/run)"]
            async fn soak_with_a_10s_probe_keepalive() {
                crate::matrix::soak_with_a_10s_keepalive($imp).await;
            }

            /// Ping enforcement alone (no connection age or idleness): the shortest probe
            /// keepalive (1 s) refused three times and doubled to 8 s, nothing else changing.
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            #[ignore = "a soak: run .ci/interop-setup (or .ci/run)"]
            async fn soak_with_ping_enforcement() {
                crate::matrix::soak_with_ping_enforcement($imp).await;
            }
        }
    )*};
}

keepalive_soak!(
    on_ccore_enforcing => Implementation::CCore,
    on_grpc_go_enforcing => Implementation::GrpcGo,
);

interop_tests!(
    on_tonic => Implementation::Tonic, [],
    on_ccore => Implementation::CCore,
        [ignore = "needs the interop servers: run .ci/interop-setup (or .ci/run)"],
    on_grpc_go => Implementation::GrpcGo,
        [ignore = "needs the interop servers: run .ci/interop-setup (or .ci/run)"],
    on_grpc_js => Implementation::GrpcJs,
        [ignore = "needs the interop servers: run .ci/interop-setup (or .ci/run)"],
);

/// Which implementations this machine can run, and exactly why not the others (the ignored
/// tests above need them all). tonic, in process, always can.
#[test]
fn availability_is_explained() {
    assert_eq!(Implementation::Tonic.available(), Ok(()));
    for imp in Implementation::ALL {
        match imp.available() {
            Ok(()) => println!("{imp}: available"),
            Err(why) => println!("{imp}: not available: {why}"),
        }
    }
}
