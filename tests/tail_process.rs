//! `changefeed tail` as a shell sees it, without a server: this file's `main` runs the
//! tool's own output loop (`src/bin/changefeed/follow.rs`, included as is) in a child
//! process of itself, over a fake feed stream that yields one page and then waits for
//! events forever, with the real Ctrl-C handler and the real standard output. The parent
//! checks:
//!
//! * Ctrl-C (SIGINT) while idle ends it with status 130, like `tail -f`;
//! * a reader that closes the pipe (`| head -3`) ends it while idle, quietly, with 0 —
//!   not only at the next event, which may never come.
//!
//! The tool's `main` maps the loop's outcome to the same statuses (`Failure::interrupted`
//! and `Failure::quiet`); its unit tests check one write and one flush per page.
//!
//! `harness = false` (Cargo.toml): the child's standard output must carry nothing but the
//! loop's lines.

#[path = "../src/bin/changefeed/follow.rs"]
#[allow(dead_code)]
mod follow;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use changefeed::Cursor;
use changefeed::reader::Page;
use follow::Stop;

const CHILD: &str = "CHANGEFEED_TAIL_PROCESS_CHILD";

fn main() {
    if std::env::var_os(CHILD).is_some() {
        child();
    }
    #[cfg(unix)]
    {
        ctrl_c_while_idle_exits_130();
        a_closed_pipe_is_noticed_while_idle();
        println!("tail_process: 2 checks passed");
    }
}

/// The child: one page of three rows, then an idle feed.
fn child() -> ! {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let page = Page {
        rows: vec![1u32, 2, 3],
        next_cursor: Cursor::START,
        page_size: 10,
    };
    let stream = futures::StreamExt::chain(
        futures::stream::iter([Ok(page)]),
        futures::stream::pending(),
    );
    let mut stdout = std::io::stdout();
    let stop = runtime.block_on(follow::follow(
        stream,
        &mut stdout,
        |n| format!("row {n}"),
        follow::interrupted(),
        follow::output_closed(),
    ));
    let status = match stop {
        Stop::Interrupted => follow::INTERRUPTED_STATUS,
        Stop::Closed | Stop::Ended => 0,
        Stop::Failed(error) => {
            eprintln!("error: {error}");
            1
        }
        Stop::Write(error) => {
            eprintln!("error: {error}");
            1
        }
    };
    std::process::exit(i32::from(status));
}

fn spawn_child() -> (Child, BufReader<std::process::ChildStdout>) {
    let mut child = Command::new(std::env::current_exe().expect("the test binary"))
        .env(CHILD, "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("the child starts");
    let mut stdout = BufReader::new(child.stdout.take().expect("piped"));
    // The page comes first: after it, the child is idle inside the loop.
    for expected in ["row 1", "row 2", "row 3"] {
        let mut line = String::new();
        stdout.read_line(&mut line).expect("a line");
        assert_eq!(line.trim_end(), expected);
    }
    (child, stdout)
}

/// The child's status, or a panic (after killing it) if it is still running after 10 s.
fn exit_within_10s(child: &mut Child, what: &str) -> ExitStatus {
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return status;
        }
        if started.elapsed() > Duration::from_secs(10) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what}: the idle tail did not stop within 10 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[cfg(unix)]
fn ctrl_c_while_idle_exits_130() {
    let (mut child, _stdout) = spawn_child();
    let sent = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .expect("kill runs");
    assert!(sent.success());
    let status = exit_within_10s(&mut child, "Ctrl-C");
    assert_eq!(status.code(), Some(130), "{status:?}");
}

#[cfg(unix)]
fn a_closed_pipe_is_noticed_while_idle() {
    let (mut child, stdout) = spawn_child();
    drop(stdout); // `| head -3` has its three lines and exits
    let status = exit_within_10s(&mut child, "closed pipe");
    assert_eq!(status.code(), Some(0), "{status:?}");
}
