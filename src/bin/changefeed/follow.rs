//! `tail`'s loop: the pages of a feed stream to an output, until the stream fails, Ctrl-C,
//! or the output's reader goes away.
//!
//! It depends on nothing else of the tool, so `tests/tail_process.rs` runs this very loop
//! in a process of its own (with a fake stream: no server needed) to check what a shell
//! sees: the exit status after Ctrl-C, and an exit while idle once `| head` has closed the
//! pipe.

use std::future::Future;
use std::io::{self, Write};

use changefeed::reader::Page;
use futures::{Stream, StreamExt};

/// The exit status of a `tail` stopped by Ctrl-C, as `tail -f`'s: 128 + SIGINT (2).
pub const INTERRUPTED_STATUS: u8 = 130;

/// Why the loop stopped.
#[derive(Debug)]
pub enum Stop {
    /// The stream ended without an error (a feed stream never does).
    Ended,
    /// The stream ended with this error.
    Failed(changefeed::Error),
    /// Ctrl-C (SIGINT).
    Interrupted,
    /// The output's reader went away (`| head -5` has read its lines).
    Closed,
    /// Writing failed for another reason (a full disk).
    Write(io::Error),
}

/// Writes each page of `stream` to `out` as lines made by `line`, in one write and one
/// flush per page (a consumer of the pipe sees whole pages, at once, for one system call
/// each). Stops when the stream fails, when `interrupted` completes, or when `closed`
/// completes — both also while the stream is idle, waiting for new events.
pub async fn follow<T, S, W>(
    stream: S,
    out: &mut W,
    line: impl Fn(T) -> String,
    interrupted: impl Future,
    closed: impl Future,
) -> Stop
where
    S: Stream<Item = changefeed::Result<Page<T>>>,
    W: Write,
{
    let mut stream = std::pin::pin!(stream);
    let mut interrupted = std::pin::pin!(interrupted);
    let mut closed = std::pin::pin!(closed);
    let mut text = String::new();
    loop {
        let page = tokio::select! {
            // Ctrl-C and a closed output win over a page that is ready at the same time.
            biased;
            _ = &mut interrupted => return Stop::Interrupted,
            _ = &mut closed => return Stop::Closed,
            page = stream.next() => page,
        };
        let page = match page {
            None => return Stop::Ended,
            Some(Err(error)) => return Stop::Failed(error),
            Some(Ok(page)) => page,
        };
        text.clear();
        for row in page.rows {
            text.push_str(&line(row));
            text.push('\n');
        }
        if let Err(error) = out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
            return if error.kind() == io::ErrorKind::BrokenPipe {
                Stop::Closed
            } else {
                Stop::Write(error)
            };
        }
    }
}

/// Completes at the first Ctrl-C (never, if the handler cannot be installed).
pub async fn interrupted() {
    if tokio::signal::ctrl_c().await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// Completes when standard output is a pipe or socket whose reader has gone away; never
/// for a terminal or a file. The kernel reports an error condition on the write end of a
/// pipe with no reader left, which this waits for without writing anything.
#[cfg(unix)]
pub async fn output_closed() {
    use std::os::fd::AsFd;
    use tokio::io::Interest;
    use tokio::io::unix::AsyncFd;

    let stdout = io::stdout();
    // Registration fails for what the kernel cannot watch (a regular file, /dev/null):
    // those never close.
    // SAFETY: the descriptor is standard output's, which this process never closes or
    // replaces, and the registration lives only as long as this future.
    let registered = unsafe { AsyncFd::register_with_interest(stdout.as_fd(), Interest::ERROR) };
    match registered {
        Ok(fd) => {
            if fd.ready(Interest::ERROR).await.is_ok() {
                return;
            }
            std::future::pending::<()>().await;
        }
        Err(_) => std::future::pending::<()>().await,
    }
}

/// Elsewhere a closed output is noticed at the next write.
#[cfg(not(unix))]
pub async fn output_closed() {
    std::future::pending::<()>().await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use changefeed::Cursor;

    /// Records every `write` call and every flush.
    #[derive(Default)]
    struct Recorder {
        writes: Vec<Vec<u8>>,
        flushes: usize,
        fail_with: Option<io::ErrorKind>,
    }

    impl Write for Recorder {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            if let Some(kind) = self.fail_with {
                return Err(kind.into());
            }
            self.writes.push(buf.to_vec());
            Ok(buf.len())
        }

        fn flush(&mut self) -> io::Result<()> {
            self.flushes += 1;
            Ok(())
        }
    }

    fn page(rows: std::ops::Range<u32>) -> changefeed::Result<Page<u32>> {
        Ok(Page {
            rows: rows.collect(),
            next_cursor: Cursor::START,
            page_size: 100,
        })
    }

    /// `pages`, then nothing ever again (a caught-up feed).
    fn then_idle(
        pages: Vec<changefeed::Result<Page<u32>>>,
    ) -> impl Stream<Item = changefeed::Result<Page<u32>>> {
        futures::stream::iter(pages).chain(futures::stream::pending())
    }

    #[tokio::test(start_paused = true)]
    async fn each_page_is_one_write_and_one_flush() {
        let mut out = Recorder::default();
        let stop = follow(
            then_idle(vec![page(0..3), page(3..5)]),
            &mut out,
            |n| format!("row {n}"),
            tokio::time::sleep(std::time::Duration::from_secs(1)),
            std::future::pending::<()>(),
        )
        .await;
        assert!(matches!(stop, Stop::Interrupted), "{stop:?}");
        assert_eq!(
            out.writes,
            [
                b"row 0\nrow 1\nrow 2\n".to_vec(),
                b"row 3\nrow 4\n".to_vec()
            ]
        );
        assert_eq!(out.flushes, 2);
    }

    #[tokio::test(start_paused = true)]
    async fn ctrl_c_and_a_closed_output_stop_an_idle_loop() {
        let mut out = Recorder::default();
        let stop = follow(
            then_idle(vec![]),
            &mut out,
            |n: u32| n.to_string(),
            tokio::time::sleep(std::time::Duration::from_secs(3600)),
            tokio::time::sleep(std::time::Duration::from_secs(1)),
        )
        .await;
        assert!(matches!(stop, Stop::Closed), "{stop:?}");
        let stop = follow(
            then_idle(vec![page(0..1)]),
            &mut out,
            |n: u32| n.to_string(),
            tokio::time::sleep(std::time::Duration::from_secs(1)),
            std::future::pending::<()>(),
        )
        .await;
        assert!(matches!(stop, Stop::Interrupted), "{stop:?}");
        assert_eq!(out.writes, [b"0\n".to_vec()]);
    }

    /// Runs the loop over `pages` with neither Ctrl-C nor a closed output.
    async fn uninterrupted(pages: Vec<changefeed::Result<Page<u32>>>, out: &mut Recorder) -> Stop {
        let never = std::future::pending::<()>;
        follow(
            then_idle(pages),
            out,
            |n: u32| n.to_string(),
            never(),
            never(),
        )
        .await
    }

    #[tokio::test]
    async fn a_broken_pipe_is_a_closed_output_and_errors_end_the_loop() {
        let mut out = Recorder {
            fail_with: Some(io::ErrorKind::BrokenPipe),
            ..Recorder::default()
        };
        let stop = uninterrupted(vec![page(0..1)], &mut out).await;
        assert!(matches!(stop, Stop::Closed), "{stop:?}");
        out.fail_with = Some(io::ErrorKind::StorageFull);
        let stop = uninterrupted(vec![page(0..1)], &mut out).await;
        assert!(matches!(stop, Stop::Write(_)), "{stop:?}");
        let failed = vec![Err(changefeed::Error::Config("x".into()))];
        let stop = uninterrupted(failed, &mut Recorder::default()).await;
        assert!(matches!(stop, Stop::Failed(_)), "{stop:?}");
    }
}
