//! Test backends driven from another process (another language's client, a script).
//!
//! ```text
//! cargo run -p test-backends --example backends -- 3
//! ```
//!
//! Starts `n` (default 3) backends on loopback and prints `ready <port> <port> ...`. Then reads
//! one command per line on stdin and answers `ok` (or `error: ...`) once it is done:
//!
//! * `stop <i>` — abrupt stop of backend `i` (every connection reset);
//! * `stop_graceful <i> <grace ms>` — GOAWAY, in-flight calls drain, the port refusing at once;
//! * `restart <i>`;
//! * `serving <i> <true|false>` — its health status;
//! * `hits <i>` — answers `ok <calls it answered>`.
//!
//! Ends when stdin closes. Used by `crates/grpc-client-kit/benches/ccore/stop_reaction.py`
//! to measure gRPC's C-core client on the same backends as the kit's reaction benchmark.

use std::io::Write;
use std::time::Duration;

use test_backends::{Backend, Backends};
use tokio::io::{AsyncBufReadExt, BufReader};

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let n: usize = std::env::args().nth(1).map_or(Ok(3), |a| a.parse())?;
    let backends = Backends::start(n).await?;
    let ports: Vec<String> = backends
        .addrs()
        .iter()
        .map(|a| a.port().to_string())
        .collect();
    println!("ready {}", ports.join(" "));
    std::io::stdout().flush()?;
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    while let Some(line) = lines.next_line().await? {
        let words: Vec<&str> = line.split_whitespace().collect();
        let reply = match run(&backends, &words).await {
            Ok(Some(value)) => format!("ok {value}"),
            Ok(None) => "ok".to_owned(),
            Err(e) => format!("error: {e}"),
        };
        println!("{reply}");
        std::io::stdout().flush()?;
    }
    Ok(())
}

/// The backend named by `word` (its index).
fn backend<'a>(backends: &'a Backends, word: Option<&&str>) -> Result<&'a Backend, String> {
    let i: usize = word
        .ok_or("missing backend index")?
        .parse()
        .map_err(|e| format!("backend index: {e}"))?;
    backends
        .as_slice()
        .get(i)
        .ok_or_else(|| format!("no backend {i}"))
}

async fn run(backends: &Backends, words: &[&str]) -> Result<Option<String>, String> {
    match words.first().copied() {
        Some("stop") => backend(backends, words.get(1))?.stop().await,
        Some("stop_graceful") => {
            let grace: u64 = words
                .get(2)
                .ok_or("missing grace (ms)")?
                .parse()
                .map_err(|e| format!("grace: {e}"))?;
            backend(backends, words.get(1))?
                .stop_graceful(Duration::from_millis(grace))
                .await;
        }
        Some("restart") => backend(backends, words.get(1))?
            .restart()
            .await
            .map_err(|e| e.to_string())?,
        Some("serving") => {
            let serving = match words.get(2).copied() {
                Some("true") => true,
                Some("false") => false,
                other => return Err(format!("serving: expected true or false, got {other:?}")),
            };
            backend(backends, words.get(1))?.set_serving(serving).await;
        }
        Some("hits") => return Ok(Some(backend(backends, words.get(1))?.hits().to_string())),
        other => return Err(format!("unknown command {other:?}")),
    }
    Ok(None)
}
