use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::*;

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u32;
    let mut out = len.to_be_bytes()[1..].to_vec();
    out.push(kind);
    out.push(flags);
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

fn goaway(code: u32, debug: &str) -> Vec<u8> {
    let mut payload = 7u32.to_be_bytes().to_vec();
    payload.extend_from_slice(&code.to_be_bytes());
    payload.extend_from_slice(debug.as_bytes());
    frame(GOAWAY, 0, 0, &payload)
}

fn state(frames: &ServerFrames) -> &'static str {
    match &*frames.inner.preface.borrow() {
        Preface::Waiting => "waiting",
        Preface::Received => "received",
        Preface::Failed(_) => "failed",
    }
}

#[test]
fn recognises_a_server_settings_frame() {
    // An empty SETTINGS frame, and one with two settings.
    assert!(is_settings_frame(&[0, 0, 0, 4, 0, 0, 0, 0, 0]));
    assert!(is_settings_frame(&[0, 0, 12, 4, 0, 0, 0, 0, 0]));
    // A SETTINGS ACK, another frame type, a stream id, a bad length.
    assert!(!is_settings_frame(&[0, 0, 0, 4, 1, 0, 0, 0, 0]));
    assert!(!is_settings_frame(&[0, 0, 8, 6, 0, 0, 0, 0, 0]));
    assert!(!is_settings_frame(&[0, 0, 0, 4, 0, 0, 0, 0, 1]));
    assert!(!is_settings_frame(&[0, 0, 5, 4, 0, 0, 0, 0, 0]));
    // A TLS alert record and an HTTP/1 status line.
    assert!(!is_settings_frame(&[0x15, 3, 3, 0, 2, 2, 0x32, 0, 0]));
    assert!(!is_settings_frame(b"HTTP/1.1 "));
}

#[test]
fn settings_first_then_a_goaway_read_byte_by_byte() {
    let frames = ServerFrames::new();
    let mut parser = Parser::default();
    let mut bytes = frame(SETTINGS, 0, 0, &[0, 3, 0, 0, 0, 100]);
    bytes.extend(frame(0x1, 0x4, 1, b"headers"));
    bytes.extend(frame(0x0, 0x0, 1, &[0u8; 1000]));
    bytes.extend(goaway(0xb, "too_many_pings"));
    for b in &bytes {
        parser.feed(std::slice::from_ref(b), &frames);
    }
    assert_eq!(state(&frames), "received");
    let g = frames.goaway().unwrap();
    assert!(g.is_too_many_pings(), "{g}");
    assert_eq!(g.last_stream_id, 7);
    assert_eq!(
        g.to_string(),
        "GOAWAY ENHANCE_YOUR_CALM (0xb) \"too_many_pings\""
    );
}

#[test]
fn a_graceful_goaway_is_not_too_many_pings() {
    let frames = ServerFrames::new();
    let mut parser = Parser::default();
    let mut bytes = frame(SETTINGS, 0, 0, &[]);
    bytes.extend(goaway(0, "max_age"));
    parser.feed(&bytes, &frames);
    let g = frames.goaway().unwrap();
    assert!(!g.is_too_many_pings());
    assert_eq!(g.to_string(), "GOAWAY NO_ERROR (0x0) \"max_age\"");
}

#[test]
fn http1_and_tls_answers_are_named() {
    let frames = ServerFrames::new();
    Parser::default().feed(b"HTTP/1.1 400 Bad Request\r\n", &frames);
    let e = frames.failure().expect("failed");
    assert!(
        e.to_string().ends_with("it looks like an HTTP/1 server"),
        "{e}"
    );

    let frames = ServerFrames::new();
    Parser::default().feed(&[0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x46, 0, 0], &frames);
    let e = frames.failure().expect("failed");
    assert!(e.to_string().contains("TLS server"), "{e}");
    assert_eq!(Speaks::guess(e.first_bytes()), Some(Speaks::Tls));
}

#[test]
fn an_early_close_is_a_failure_and_a_huge_debug_is_cut() {
    let frames = ServerFrames::new();
    let mut parser = Parser::default();
    parser.ended(&frames, &Ok(()));
    assert_eq!(state(&frames), "failed");

    let frames = ServerFrames::new();
    let mut parser = Parser::default();
    let mut bytes = frame(SETTINGS, 0, 0, &[]);
    bytes.extend(goaway(2, &"x".repeat(10_000)));
    parser.feed(&bytes, &frames);
    assert_eq!(frames.goaway().unwrap().debug.len(), MAX_DEBUG);
}

#[tokio::test]
async fn the_watch_reports_settings_and_passes_bytes_through() {
    for (server_sends, expect_ok) in [
        (&[0u8, 0, 0, 4, 0, 0, 0, 0, 0, 0xAA][..], true),
        (&b"HTTP/1.1 400 Bad Request\r\n"[..], false),
        (&[0x15, 3, 3, 0, 2, 2, 0x32][..], false),
    ] {
        let (client, mut server) = tokio::io::duplex(64);
        let frames = ServerFrames::new();
        let mut watched = frames.watch(client);
        // Byte by byte: the header is assembled across reads.
        for b in server_sends {
            server.write_all(&[*b]).await.unwrap();
        }
        drop(server);
        let mut got = Vec::new();
        watched.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, server_sends, "bytes pass through unchanged");
        match (frames.preface().await, expect_ok) {
            (Ok(()), true) => {}
            (Err(e), false) => {
                assert_eq!(e.first_bytes(), &server_sends[..server_sends.len().min(9)]);
                let text = e.to_string();
                if server_sends[0] == 0x15 {
                    assert!(matches!(*e, NotConnected::Closed(_)), "{e:?}");
                    assert!(text.contains("it looks like a TLS server"), "{text}");
                } else {
                    assert!(matches!(*e, NotConnected::NotHttp2(_)), "{e:?}");
                    assert!(text.contains("did not answer with HTTP/2"), "{text}");
                    assert!(text.ends_with("it looks like an HTTP/1 server"), "{text}");
                }
            }
            (other, _) => panic!("{server_sends:?}: {other:?}"),
        }
    }
}

#[tokio::test]
async fn a_write_failure_or_a_drop_before_the_settings_is_a_failure() {
    // The server went away before saying anything: the client's first write fails, and
    // hyper drops the connection without reading (seen with a TLS server that refused the
    // client certificate).
    let (client, server) = tokio::io::duplex(64);
    let frames = ServerFrames::new();
    let mut watched = frames.watch(client);
    drop(server);
    assert!(watched.write_all(b"PRI * HTTP/2.0").await.is_err());
    assert!(frames.failure().is_some(), "reported at the write");

    // Dropped while waiting, without any read or write error.
    let (client, _server) = tokio::io::duplex(64);
    let frames = ServerFrames::new();
    let watched = frames.watch(client);
    drop(watched);
    let e = frames.failure().expect("reported on drop");
    assert!(
        e.to_string()
            .ends_with("before sending its HTTP/2 settings"),
        "{e}"
    );
}

#[tokio::test]
async fn an_early_close_is_a_failure() {
    let (client, server) = tokio::io::duplex(64);
    let frames = ServerFrames::new();
    let mut watched = frames.watch(client);
    drop(server);
    let mut got = Vec::new();
    watched.read_to_end(&mut got).await.unwrap();
    let e = frames.preface().await.unwrap_err();
    assert_eq!(
        e.to_string(),
        "the server closed the connection before sending its HTTP/2 settings"
    );
}

#[tokio::test]
async fn a_new_connection_waits_for_its_own_preface() {
    let frames = ServerFrames::new();
    let (client, server) = tokio::io::duplex(64);
    drop(frames.watch(client));
    drop(server);
    assert!(frames.failure().is_some());
    let (client, mut server) = tokio::io::duplex(64);
    let mut watched = frames.watch(client);
    assert!(frames.failure().is_none(), "the old failure is forgotten");
    server
        .write_all(&[0, 0, 0, 4, 0, 0, 0, 0, 0])
        .await
        .unwrap();
    let mut header = [0u8; 9];
    watched.read_exact(&mut header).await.unwrap();
    assert!(frames.preface().await.is_ok());
}
