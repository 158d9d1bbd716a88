//! Driving the `changefeed` binary as a process: one run to its end and its one-line error,
//! signals, a bounded wait for its exit, its standard error line by line.

#![allow(dead_code)] // each test binary uses its own part

use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

/// Runs the tool with `args` to its end, stdin closed, without `CHANGEFEED_URL` (and
/// `RUST_BACKTRACE`) in its environment.
pub fn changefeed(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_changefeed"))
        .args(args)
        .env_remove("CHANGEFEED_URL")
        .env_remove("RUST_BACKTRACE")
        .stdin(Stdio::null())
        .output()
        .expect("the changefeed binary runs")
}

/// Exactly one line on stderr, starting with `error: `, nothing on stdout, a non-zero exit:
/// that line.
pub fn assert_one_error_line(output: &Output) -> String {
    let stderr = String::from_utf8_lossy(&output.stderr);
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "one line on stderr, got {lines:#?}");
    assert!(lines[0].starts_with("error: "), "{}", lines[0]);
    assert!(!lines[0].contains("panicked"), "{}", lines[0]);
    assert!(output.stdout.is_empty(), "nothing on stdout: {output:?}");
    assert!(!output.status.success(), "{output:?}");
    lines[0].to_owned()
}

/// Sends `signal` to `child`.
pub fn signal(child: &Child, signal: libc::c_int) {
    let pid = libc::pid_t::try_from(child.id()).expect("a pid");
    // SAFETY: kill(2) with a pid of our own child and a valid signal number.
    let result = unsafe { libc::kill(pid, signal) };
    assert_eq!(result, 0, "kill({pid}, {signal})");
}

/// Waits up to `limit` for `child` to exit (killing it and failing the test past that), and
/// returns its status and what is left on its standard error.
pub fn wait_for_exit(mut child: Child, limit: Duration) -> (ExitStatus, String) {
    use std::io::Read;
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            break status;
        }
        if started.elapsed() > limit {
            child.kill().ok();
            child.wait().ok();
            panic!("the child did not exit within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut stderr = String::new();
    if let Some(mut pipe) = child.stderr.take() {
        pipe.read_to_string(&mut stderr).ok();
    }
    (status, stderr)
}

/// The lines `child` writes on standard error, as they come (read by a thread of their own;
/// the channel ends when the child closes it).
pub fn stderr_lines(child: &mut Child) -> std::sync::mpsc::Receiver<String> {
    use std::io::{BufRead, BufReader};
    let pipe = child.stderr.take().expect("stderr is piped");
    let (sender, receiver) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(pipe).lines() {
            let Ok(line) = line else { break };
            if sender.send(line).is_err() {
                break;
            }
        }
    });
    receiver
}
