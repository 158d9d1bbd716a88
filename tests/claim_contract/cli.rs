//! `changefeed relay` over a store's outbox, as a process: what every store's URL gives,
//! written once.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use changefeed::outbox::{Enqueued, NewMessage};

use super::message_of;

/// The one message [`relays_a_message_as_a_json_line`] expects in the outbox.
pub fn cli_message() -> NewMessage {
    message_of("cli-1", 1)
}

/// `changefeed relay --outbox <outbox> --url <url> <extra>` over an outbox holding
/// [`cli_message`] (enqueued as `sent`): the message is printed as a JSON line and
/// acknowledged (`done()` counts the outbox's done rows), and SIGTERM stops the relay with
/// exit status 0 within 30 s.
pub async fn relays_a_message_as_a_json_line(
    url: &str,
    outbox: &str,
    extra: &[&str],
    sent: &Enqueued,
    done: impl AsyncFn() -> i64,
) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_changefeed"))
        .args(["relay", "--outbox", outbox, "--url", url])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("the changefeed binary runs");
    let stdout = child.stdout.take().unwrap();
    let line = tokio::task::spawn_blocking(move || {
        BufReader::new(stdout).lines().next().map(|l| l.unwrap())
    });
    let line = tokio::time::timeout(Duration::from_secs(30), line)
        .await
        .expect("a line within 30 s")
        .unwrap();
    // Printed, then acknowledged: done within moments.
    let started = Instant::now();
    while done().await == 0 {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "never marked done"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let pid = libc::pid_t::try_from(child.id()).expect("a pid");
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let status = tokio::task::spawn_blocking(move || child.wait().unwrap());
    let status = tokio::time::timeout(Duration::from_secs(30), status)
        .await
        .expect("SIGTERM stops the relay within 30 s")
        .unwrap();
    assert_eq!(status.code(), Some(0));
    let line: serde_json::Value = serde_json::from_str(&line.expect("one line")).unwrap();
    assert_eq!(line["id"], sent.id);
    assert_eq!(line["key"], "cli-1");
    assert_eq!(
        line["payload"],
        serde_json::json!({ "aggregate": "cli-1", "n": 1 })
    );
}
