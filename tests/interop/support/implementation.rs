//! The four implementations, and where each one's backend program comes from.

use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::OnceLock;

use tokio::process::Command;

use super::ServerSettings;

/// The folder holding the backend programs.
fn backends_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/interop/backends")
}

/// A gRPC server implementation the kit is tested against.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Implementation {
    /// tonic (the version this workspace builds), in process.
    Tonic,
    /// gRPC C-core, through Python's `grpcio`.
    CCore,
    /// grpc-go (Debian's `golang-google-grpc-dev`, 1.33).
    GrpcGo,
    /// grpc-js (`@grpc/grpc-js` 1.14) on node.
    GrpcJs,
}

/// How to run one implementation's backend program, found once.
#[derive(Debug)]
struct Launcher {
    /// The program and the arguments before the backend's own.
    command: Vec<String>,
    /// The implementation's version, where it is read at run time (grpcio).
    version: Option<String>,
}

impl Implementation {
    /// Every implementation, tonic first.
    pub(crate) const ALL: [Implementation; 4] = [
        Implementation::Tonic,
        Implementation::CCore,
        Implementation::GrpcGo,
        Implementation::GrpcJs,
    ];

    /// `Ok` if its backend can be started here; otherwise exactly what is missing.
    pub(crate) fn available(self) -> Result<(), String> {
        self.launcher().map(|_| ())
    }

    /// The launcher, looked up once per implementation.
    fn launcher(self) -> Result<&'static Launcher, String> {
        static FOUND: [OnceLock<Result<Launcher, String>>; 4] = [
            OnceLock::new(),
            OnceLock::new(),
            OnceLock::new(),
            OnceLock::new(),
        ];
        let index = Self::ALL.iter().position(|&i| i == self).expect("listed");
        FOUND[index]
            .get_or_init(|| self.find_launcher())
            .as_ref()
            .map_err(Clone::clone)
    }

    fn find_launcher(self) -> Result<Launcher, String> {
        match self {
            Implementation::Tonic => Ok(Launcher {
                command: Vec::new(),
                version: None,
            }),
            Implementation::CCore => find_python(),
            Implementation::GrpcGo => find_go_server(),
            Implementation::GrpcJs => find_node(),
        }
    }

    /// Whether the server enforces a keepalive policy on client pings (gRFC A8): a client pinging
    /// too often gets `GOAWAY ENHANCE_YOUR_CALM "too_many_pings"`.
    pub(crate) fn enforces_pings(self) -> bool {
        matches!(self, Implementation::CCore | Implementation::GrpcGo)
    }
}

impl fmt::Display for Implementation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Implementation::Tonic => f.write_str("tonic"),
            Implementation::CCore => {
                let version = self.launcher().ok().and_then(|l| l.version.as_deref());
                write!(f, "C-core (grpcio {})", version.unwrap_or("?"))
            }
            Implementation::GrpcGo => f.write_str("grpc-go"),
            Implementation::GrpcJs => f.write_str("grpc-js"),
        }
    }
}

/// Runs `program args` and returns its stdout if it succeeds, else why not.
fn run(program: &str, args: &[&str]) -> Result<String, String> {
    let output = std::process::Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run {program}: {e}"))?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
    } else {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let last = stderr.lines().last().unwrap_or("").trim().to_owned();
        Err(format!(
            "{program} {}: {} ({last})",
            args.join(" "),
            output.status
        ))
    }
}

/// The value of `var` if set and not empty.
fn env(var: &str) -> Option<String> {
    std::env::var(var).ok().filter(|v| !v.is_empty())
}

const SETUP_HINT: &str = "run .ci/interop-setup and export what it prints";

fn find_python() -> Result<Launcher, String> {
    const PROBE: &str = "import grpc, grpc_health.v1.health; print(grpc.__version__)";
    let script = backends_dir().join("ccore/server.py");
    let launcher = |python: String, version: String| Launcher {
        command: vec![python, script.display().to_string()],
        version: Some(version),
    };
    if let Some(python) = env("GCK_INTEROP_PYTHON") {
        return run(&python, &["-c", PROBE])
            .map(|version| launcher(python.clone(), version))
            .map_err(|e| {
                format!(
                    "GCK_INTEROP_PYTHON={python} cannot import grpc and grpc_health \
                     (grpcio, grpcio-health-checking): {e}"
                )
            });
    }
    run("python3", &["-c", PROBE])
        .map(|version| launcher("python3".to_owned(), version))
        .map_err(|e| {
            format!(
                "no Python with grpcio and grpcio-health-checking: GCK_INTEROP_PYTHON is not \
                 set and python3 cannot import them ({e}); {SETUP_HINT}"
            )
        })
}

fn find_go_server() -> Result<Launcher, String> {
    let (path, from) = match env("GCK_INTEROP_GO_SERVER") {
        Some(path) => (PathBuf::from(path), "GCK_INTEROP_GO_SERVER"),
        None => (
            Path::new(env!("CARGO_MANIFEST_DIR")).join("target/interop/grpcgo-server"),
            "GCK_INTEROP_GO_SERVER is not set, and the default",
        ),
    };
    if !path.is_file() {
        return Err(format!(
            "no grpc-go backend binary: {from} {} does not exist (it is built from \
             tests/interop/backends/grpcgo/server.go); {SETUP_HINT}",
            path.display()
        ));
    }
    Ok(Launcher {
        command: vec![path.display().to_string()],
        version: None,
    })
}

fn find_node() -> Result<Launcher, String> {
    let node = env("GCK_INTEROP_NODE").unwrap_or_else(|| "node".to_owned());
    run(&node, &["--version"]).map_err(|e| {
        format!("no node for the grpc-js backend (GCK_INTEROP_NODE or `node`): {e}; {SETUP_HINT}")
    })?;
    let dir = backends_dir().join("grpcjs");
    for package in ["@grpc/grpc-js", "grpc-health-check"] {
        let installed = dir.join("node_modules").join(package).join("package.json");
        if !installed.is_file() {
            return Err(format!(
                "the grpc-js backend's {package} is not installed: {} does not exist; run \
                 `npm ci` in {} ({SETUP_HINT})",
                installed.display(),
                dir.display()
            ));
        }
    }
    Ok(Launcher {
        command: vec![node, dir.join("server.js").display().to_string()],
        version: None,
    })
}

impl Implementation {
    /// The command line of its backend program (not for tonic, which runs in process).
    pub(super) fn command(self, name: &str, port: u16, settings: &ServerSettings) -> Command {
        let launcher = self
            .launcher()
            .unwrap_or_else(|why| panic!("{self}: {why}"));
        let (program, before) = launcher.command.split_first().expect("a program");
        let mut command = Command::new(program);
        command
            .args(before)
            .args(["--name", name, "--port", &port.to_string()])
            .args(settings.args());
        command
    }
}
