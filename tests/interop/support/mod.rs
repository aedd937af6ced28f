//! The interop harness: the same test backend — `gck.test.v1.TestService`, the implementation's
//! own `grpc.health.v1` service, fault controls — on four gRPC server implementations, each
//! started with its default settings or with "production" server settings.
//!
//! * tonic: in process, `test_backends::Backend::start_with`.
//! * gRPC C-core: `backends/ccore/server.py` run by a Python with `grpcio` and
//!   `grpcio-health-checking`: `$GCK_INTEROP_PYTHON`, else `python3` if it imports them.
//! * grpc-go: the binary built from `backends/grpcgo/server.go`: `$GCK_INTEROP_GO_SERVER`, else
//!   `target/interop/grpcgo-server` if it exists.
//! * grpc-js: `backends/grpcjs/server.js` run by `$GCK_INTEROP_NODE` (default `node`), with its
//!   `node_modules` installed by `npm ci` next to it.
//!
//! `.ci/interop-setup` installs and builds all of them and prints the variables to export. Every
//! program speaks the control protocol described in its own header (`ready <port>`, then
//! `health`, `fail`, `delay`, `hits`, `stop` on stdin, one answer line each).

pub(crate) mod client;
pub(crate) mod h2_probe;
mod implementation;
mod program;
mod settings;

use std::time::Duration;

use test_backends::Backend;
use test_backends::pb::{SERVICE_NAME, UNARY_PATH};
use tokio::sync::Mutex;
use tonic_health::ServingStatus;

pub(crate) use implementation::Implementation;
use program::Program;
pub(crate) use settings::ServerSettings;

/// One test backend on `127.0.0.1`, of any implementation. Its process is killed when dropped.
#[derive(Debug)]
pub(crate) struct InteropBackend {
    imp: Implementation,
    name: String,
    settings: ServerSettings,
    port: u16,
    inner: Inner,
}

#[derive(Debug)]
enum Inner {
    Tonic(Backend),
    /// `None` while stopped or killed.
    Program(Box<Mutex<Option<Program>>>),
}

impl InteropBackend {
    /// Starts a backend named `name` on a free port, health `SERVING` for `""` and
    /// `gck.test.v1.TestService`. Panics, saying why, if it cannot (implementation not
    /// available, a setting it cannot honour, the program failing).
    pub(crate) async fn start(imp: Implementation, name: &str, settings: &ServerSettings) -> Self {
        if let Err(why) = imp.available() {
            panic!("cannot start a {imp} backend: {why}");
        }
        let (port, inner) = match imp {
            Implementation::Tonic => {
                let options = settings
                    .tonic_options()
                    .unwrap_or_else(|why| panic!("cannot start a tonic backend: {why}"));
                let backend = Backend::start_with(name, options)
                    .await
                    .unwrap_or_else(|e| panic!("tonic backend {name} did not start: {e}"));
                (backend.addr().port(), Inner::Tonic(backend))
            }
            _ => {
                let program = Program::spawn(imp.command(name, 0, settings))
                    .await
                    .unwrap_or_else(|e| panic!("{imp} backend {name} did not start: {e}"));
                (
                    program.port(),
                    Inner::Program(Box::new(Mutex::new(Some(program)))),
                )
            }
        };
        Self {
            imp,
            name: name.to_owned(),
            settings: settings.clone(),
            port,
            inner,
        }
    }

    /// `http://127.0.0.1:PORT`, the same across restarts.
    pub(crate) fn uri(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Its port on `127.0.0.1`.
    pub(crate) fn port(&self) -> u16 {
        self.port
    }

    /// Its implementation.
    pub(crate) fn implementation(&self) -> Implementation {
        self.imp
    }

    /// Sets the health of `service` (`""`: the whole server). Panics if the backend was started
    /// without the health service.
    pub(crate) async fn set_health(&self, service: &str, status: ServingStatus) {
        assert!(
            self.settings.health,
            "{}: started without health",
            self.name
        );
        match &self.inner {
            Inner::Tonic(backend) => backend.set_service_status(service, status).await,
            Inner::Program(_) => {
                let status = match status {
                    ServingStatus::Unknown => "UNKNOWN",
                    ServingStatus::Serving => "SERVING",
                    ServingStatus::NotServing => "NOT_SERVING",
                };
                let service = if service.is_empty() { "-" } else { service };
                self.control(&format!("health {service} {status}")).await;
            }
        }
    }

    /// The next `n` Unary calls fail with `code` and the message `injected failure` (tonic:
    /// `<name>: injected failure`, and its server-stream calls too); `n = 0` clears.
    pub(crate) async fn fail_next(&self, n: u32, code: tonic::Code) {
        match &self.inner {
            Inner::Tonic(backend) => backend.fail_next(n.into(), code),
            Inner::Program(_) => {
                self.control(&format!("fail {n} {}", code as i32)).await;
            }
        }
    }

    /// Every TestService call waits `delay` before it is answered; zero turns it off.
    pub(crate) async fn set_delay(&self, delay: Duration) {
        match &self.inner {
            Inner::Tonic(backend) => backend.set_delay(delay),
            Inner::Program(_) => {
                self.control(&format!("delay {}", delay.as_millis())).await;
            }
        }
    }

    /// Unary calls received since the (re)start.
    pub(crate) async fn hits(&self) -> u64 {
        match &self.inner {
            Inner::Tonic(backend) => backend.hits_for(UNARY_PATH),
            Inner::Program(_) => {
                let value = self.control("hits").await.unwrap_or_default();
                value
                    .parse()
                    .unwrap_or_else(|_| panic!("{}: `hits` answered {value:?}", self.name))
            }
        }
    }

    /// Graceful stop: new connections are refused at once, every connection gets a GOAWAY,
    /// calls in flight may finish within `grace`; returns once everything is closed.
    pub(crate) async fn stop_graceful(&mut self, grace: Duration) {
        match &mut self.inner {
            Inner::Tonic(backend) => backend.stop_graceful(grace).await,
            Inner::Program(program) => {
                let program = program.get_mut().take();
                let program = program.unwrap_or_else(|| panic!("{}: not running", self.name));
                if let Err(why) = program.stop(grace).await {
                    panic!("{} ({}): graceful stop failed: {why}", self.name, self.imp);
                }
            }
        }
    }

    /// Abrupt stop: the process is killed (SIGKILL); tonic's backend resets every connection.
    /// The port refuses connections once this returns.
    pub(crate) async fn kill(&mut self) {
        match &mut self.inner {
            Inner::Tonic(backend) => backend.stop().await,
            Inner::Program(program) => {
                if let Some(program) = program.get_mut().take() {
                    program.kill().await;
                }
            }
        }
    }

    /// Serves again on the same port with the same settings, as a fresh server: health `SERVING`
    /// for `""` and the test service, no faults, counters from zero. Kills the running one first.
    pub(crate) async fn restart(&mut self) {
        self.kill().await;
        match &mut self.inner {
            Inner::Tonic(backend) => {
                backend.reset_counters();
                backend.set_delay(Duration::ZERO);
                backend.fail_next(0, tonic::Code::Unknown);
                backend.fail_always(None);
                backend.set_service_status("", ServingStatus::Serving).await;
                backend
                    .set_service_status(SERVICE_NAME, ServingStatus::Serving)
                    .await;
                if let Err(e) = backend.restart().await {
                    panic!(
                        "{}: tonic restart on port {} failed: {e}",
                        self.name, self.port
                    );
                }
            }
            Inner::Program(program) => {
                let command = self.imp.command(&self.name, self.port, &self.settings);
                let started = Program::spawn(command).await.unwrap_or_else(|e| {
                    panic!("{} ({}): restart failed: {e}", self.name, self.imp)
                });
                assert_eq!(started.port(), self.port, "restarted on another port");
                *program.get_mut() = Some(started);
            }
        }
    }

    /// Sends one control command to the program; panics on an error answer.
    async fn control(&self, line: &str) -> Option<String> {
        let Inner::Program(program) = &self.inner else {
            unreachable!("tonic backends are controlled in process");
        };
        let mut program = program.lock().await;
        let program = program
            .as_mut()
            .unwrap_or_else(|| panic!("{}: `{line}` while not running", self.name));
        program
            .command(line)
            .await
            .unwrap_or_else(|why| panic!("{} ({}): `{line}`: {why}", self.name, self.imp))
    }
}
