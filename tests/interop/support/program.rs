//! One backend program as a child process, driven over its stdin/stdout control protocol:
//! it prints `ready <port>`, then answers each command line with `ok`, `ok <value>` or
//! `error: <why>`.

use std::collections::VecDeque;
use std::process::Stdio;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

/// How long a program may take to print `ready` (an interpreter starting, grpcio loading).
const READY_LIMIT: Duration = Duration::from_secs(30);
/// How long a program may take to answer a command (other than `stop`, which adds its grace).
const ANSWER_LIMIT: Duration = Duration::from_secs(10);
/// Lines of the program's stderr kept for error messages; older ones are dropped.
const STDERR_TAIL: usize = 40;

/// A running backend program. Killed (SIGKILL) when dropped.
#[derive(Debug)]
pub(crate) struct Program {
    child: Child,
    stdin: ChildStdin,
    stdout: Lines<BufReader<ChildStdout>>,
    stderr: Arc<Mutex<VecDeque<String>>>,
    port: u16,
}

impl Program {
    /// Spawns `command` and waits for its `ready <port>` line. On failure, the error says what
    /// the program wrote on stderr and how it exited.
    pub(crate) async fn spawn(mut command: Command) -> Result<Self, String> {
        let shown = format!("{:?}", command.as_std());
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("cannot run {shown}: {e}"))?;
        let stdin = child.stdin.take().expect("piped stdin");
        let stdout = BufReader::new(child.stdout.take().expect("piped stdout")).lines();
        let stderr = Arc::new(Mutex::new(VecDeque::with_capacity(STDERR_TAIL)));
        let mut err_lines = BufReader::new(child.stderr.take().expect("piped stderr")).lines();
        let tail = Arc::clone(&stderr);
        tokio::spawn(async move {
            while let Ok(Some(line)) = err_lines.next_line().await {
                let mut tail = tail.lock().unwrap_or_else(PoisonError::into_inner);
                if tail.len() == STDERR_TAIL {
                    tail.pop_front();
                }
                tail.push_back(line);
            }
        });
        let mut program = Self {
            child,
            stdin,
            stdout,
            stderr,
            port: 0,
        };
        let line = match tokio::time::timeout(READY_LIMIT, program.stdout.next_line()).await {
            Ok(Ok(Some(line))) => line,
            Ok(Ok(None)) => return Err(program.died(&shown).await),
            Ok(Err(e)) => return Err(format!("{shown}: reading stdout: {e}")),
            Err(_) => return Err(format!("{shown}: no `ready` line in {READY_LIMIT:?}")),
        };
        program.port = line
            .strip_prefix("ready ")
            .and_then(|port| port.trim().parse().ok())
            .ok_or_else(|| format!("{shown}: expected `ready <port>`, got {line:?}"))?;
        Ok(program)
    }

    /// The port it serves on.
    pub(crate) fn port(&self) -> u16 {
        self.port
    }

    /// Sends one command line and returns the answer: `Ok(None)` for `ok`, `Ok(Some(value))` for
    /// `ok <value>`, `Err(why)` for `error: <why>` or a dead program.
    pub(crate) async fn command(&mut self, line: &str) -> Result<Option<String>, String> {
        self.command_within(line, ANSWER_LIMIT).await
    }

    async fn command_within(
        &mut self,
        line: &str,
        limit: Duration,
    ) -> Result<Option<String>, String> {
        let sent = self.stdin.write_all(format!("{line}\n").as_bytes()).await;
        if let Err(e) = sent {
            return Err(format!("cannot send {line:?}: {e}; {}", self.stderr_tail()));
        }
        let _ = self.stdin.flush().await;
        let answer = match tokio::time::timeout(limit, self.stdout.next_line()).await {
            Ok(Ok(Some(answer))) => answer,
            Ok(Ok(None)) => return Err(format!("no answer to {line:?}: {}", self.died("").await)),
            Ok(Err(e)) => return Err(format!("no answer to {line:?}: {e}")),
            Err(_) => return Err(format!("no answer to {line:?} in {limit:?}")),
        };
        if answer == "ok" {
            Ok(None)
        } else if let Some(value) = answer.strip_prefix("ok ") {
            Ok(Some(value.to_owned()))
        } else if let Some(why) = answer.strip_prefix("error: ") {
            Err(why.to_owned())
        } else {
            Err(format!("unexpected answer to {line:?}: {answer:?}"))
        }
    }

    /// `stop <grace_ms>`: waits for the answer (given after the program stopped serving) and
    /// for the process to exit.
    pub(crate) async fn stop(mut self, grace: Duration) -> Result<(), String> {
        let limit = grace + ANSWER_LIMIT;
        self.command_within(&format!("stop {}", grace.as_millis()), limit)
            .await?;
        match tokio::time::timeout(ANSWER_LIMIT, self.child.wait()).await {
            Ok(Ok(status)) if status.success() => Ok(()),
            Ok(Ok(status)) => Err(format!("exited with {status} after stop")),
            Ok(Err(e)) => Err(format!("waiting for exit: {e}")),
            Err(_) => Err(format!(
                "still running {ANSWER_LIMIT:?} after `stop` answered"
            )),
        }
    }

    /// SIGKILL, and waits until the process is gone (its sockets closed by the kernel).
    pub(crate) async fn kill(mut self) {
        let _ = self.child.kill().await;
    }

    /// Why the program stopped talking: its exit status and stderr.
    async fn died(&mut self, shown: &str) -> String {
        let status = tokio::time::timeout(Duration::from_secs(2), self.child.wait()).await;
        // Give the stderr reader a moment to collect the last lines.
        tokio::time::sleep(Duration::from_millis(50)).await;
        let status = match status {
            Ok(Ok(status)) => status.to_string(),
            Ok(Err(e)) => format!("unknown exit ({e})"),
            Err(_) => "still running".to_owned(),
        };
        format!("{shown} ended: {status}; {}", self.stderr_tail())
    }

    fn stderr_tail(&self) -> String {
        let tail = self.stderr.lock().unwrap_or_else(PoisonError::into_inner);
        if tail.is_empty() {
            "stderr: (empty)".to_owned()
        } else {
            let lines: Vec<&str> = tail.iter().map(String::as_str).collect();
            format!("stderr:\n{}", lines.join("\n"))
        }
    }
}
