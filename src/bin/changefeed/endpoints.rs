//! `--metrics-addr`: `/metrics` (Prometheus text), `/healthz` and `/readyz` over plain
//! HTTP/1.1, one request per connection.
//!
//! Small on purpose: GET (or HEAD) of three paths, a request head of at most 8 KiB; each
//! connection is read, answered and closed within 5 s, and at most 64 are served at once
//! (more wait in the listener's backlog, in the kernel). A slow or silent client costs one
//! task until that bound, and a flood of them no more than 64 file descriptors, which the
//! relay's own connections need; never the relay's loop.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;
use tokio::time::timeout;

use crate::args::MetricsArgs;
use crate::failure::Failure;
use crate::progress::print_stderr;
use crate::prometheus::{PrometheusRecorder, Registry};

/// The longest request head read.
const MAX_HEAD: usize = 8 * 1024;
/// The longest one connection is served: its request read, answered and written.
const REQUEST_BOUND: Duration = Duration::from_secs(5);
/// The most connections served at once. The next is accepted only when one of them ends,
/// so a flood waits in the listener's backlog (the kernel's, bounded by it) instead of
/// taking this process's file descriptors.
const MAX_CONNECTIONS: usize = 64;

/// Which of a job's timestamps readiness looks at.
#[derive(Clone, Copy, Debug)]
// The export exists only with the kafka feature.
#[cfg_attr(not(feature = "kafka"), allow(dead_code))]
pub enum Freshness {
    /// The relay: the newest `changefeed_relay_last_claim_timestamp_seconds` (one outbox).
    LastClaim,
    /// The export: the oldest `changefeed_export_last_read_timestamp_seconds`: every shard
    /// must have read lately.
    LastRead,
}

impl Freshness {
    fn gauge(self) -> &'static str {
        match self {
            Freshness::LastClaim => changefeed::metrics::RELAY_LAST_CLAIM,
            Freshness::LastRead => changefeed::metrics::EXPORT_LAST_READ,
        }
    }

    fn what(self) -> &'static str {
        match self {
            Freshness::LastClaim => "claim",
            Freshness::LastRead => "read_feed call of every shard",
        }
    }
}

/// What `/readyz` answers from.
pub struct Readiness {
    registry: Registry,
    freshness: Freshness,
    within: Duration,
    /// Set once the start-up checks passed (database and broker reached) and the job runs.
    running: AtomicBool,
}

impl Readiness {
    /// Ready when the job runs and its last successful claim (or every shard's last read)
    /// is at most `within` old.
    pub fn check(&self, now: SystemTime) -> Result<String, String> {
        if !self.running.load(Ordering::Relaxed) {
            return Err("starting: the database and the brokers are being checked".to_owned());
        }
        let values = self.registry.gauge_values(self.freshness.gauge());
        let last = match self.freshness {
            Freshness::LastClaim => values.iter().copied().reduce(f64::max),
            Freshness::LastRead => values.iter().copied().reduce(f64::min),
        };
        let what = self.freshness.what();
        let Some(last) = last.filter(|&t| t > 0.0) else {
            return Err(format!("no successful {what} yet"));
        };
        let now = now
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs_f64();
        let age = (now - last).max(0.0);
        if age > self.within.as_secs_f64() {
            Err(format!(
                "the last successful {what} was {age:.1} s ago, more than --ready-within ({:?})",
                self.within
            ))
        } else {
            Ok(format!(
                "ready: the last successful {what} was {age:.1} s ago"
            ))
        }
    }
}

/// The endpoints of one job: its recorder's registry, its readiness, and the task serving
/// them (stopped when this is dropped).
pub struct Endpoints {
    readiness: Arc<Readiness>,
    task: JoinHandle<()>,
    address: SocketAddr,
}

impl Endpoints {
    /// Starts the endpoints `--metrics-addr` asks for (none without it), naming the address
    /// on standard error unless `quiet`.
    pub async fn serve(
        args: &MetricsArgs,
        freshness: Freshness,
        quiet: bool,
    ) -> Result<Option<Endpoints>, Failure> {
        let Some(address) = args.metrics_addr else {
            return Ok(None);
        };
        let endpoints = Endpoints::start(address, freshness, args.ready_within.value).await?;
        if !quiet {
            print_stderr(&format!(
                "serving metrics on http://{0}/metrics (and /healthz, /readyz)",
                endpoints.address()
            ));
        }
        Ok(Some(endpoints))
    }

    /// Installs the command line's recorder and listens on `address`: a one-line usage
    /// failure (exit 2) when the address cannot be bound. Ready once [`Self::running`] is
    /// called and the job's `freshness` timestamp is at most `within` old.
    pub async fn start(
        address: SocketAddr,
        freshness: Freshness,
        within: Duration,
    ) -> Result<Self, Failure> {
        let listener = TcpListener::bind(address).await.map_err(|error| {
            Failure::usage(format!(
                "cannot serve metrics on --metrics-addr {address}: {error}; choose a free \
                 port, or an address of this machine"
            ))
        })?;
        let address = listener.local_addr().unwrap_or(address);
        let registry = Registry::default();
        // Only one recorder per process; a second start (never in the command line) keeps
        // the first.
        if metrics::set_global_recorder(PrometheusRecorder(registry.clone())).is_err() {
            return Err(Failure::run("a metrics recorder is already installed"));
        }
        changefeed::metrics::describe();
        let readiness = Arc::new(Readiness {
            registry: registry.clone(),
            freshness,
            within,
            running: AtomicBool::new(false),
        });
        let task = tokio::spawn(serve(listener, registry, Arc::clone(&readiness)));
        Ok(Endpoints {
            readiness,
            task,
            address,
        })
    }

    /// The address it listens on (the port the system chose for port 0).
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// The start-up checks passed: readiness now follows the job's timestamps.
    pub fn running(&self) {
        self.readiness.running.store(true, Ordering::Relaxed);
    }
}

impl Drop for Endpoints {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve(listener: TcpListener, registry: Registry, readiness: Arc<Readiness>) {
    let connections = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let Ok(permit) = Arc::clone(&connections).acquire_owned().await else {
            return; // never closed
        };
        match listener.accept().await {
            Ok((stream, _)) => {
                let (registry, readiness) = (registry.clone(), Arc::clone(&readiness));
                tokio::spawn(async move {
                    let _ = timeout(REQUEST_BOUND, answer(stream, registry, readiness)).await;
                    drop(permit);
                });
            }
            // Out of file descriptors, say: pause rather than spin.
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// Reads one request and answers it (the caller bounds the whole in time).
async fn answer(mut stream: TcpStream, registry: Registry, readiness: Arc<Readiness>) {
    let Some(head) = read_head(&mut stream).await else {
        return;
    };
    let response = respond(&head, &registry, &readiness, SystemTime::now());
    if stream.write_all(&response).await.is_ok() {
        let _ = stream.shutdown().await;
    }
}

/// The request head (up to the blank line), or `None` when the client sent too much or
/// closed first.
async fn read_head(stream: &mut TcpStream) -> Option<String> {
    let mut head = Vec::with_capacity(512);
    let mut buffer = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && !head.windows(2).any(|w| w == b"\n\n") {
        let read = stream.read(&mut buffer).await.ok()?;
        if read == 0 || head.len() + read > MAX_HEAD {
            return None;
        }
        head.extend_from_slice(&buffer[..read]);
    }
    Some(String::from_utf8_lossy(&head).into_owned())
}

/// The whole HTTP response to a request `head`.
fn respond(head: &str, registry: &Registry, readiness: &Readiness, now: SystemTime) -> Vec<u8> {
    let mut words = head.lines().next().unwrap_or("").split_whitespace();
    let (method, target) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    let text = "text/plain; charset=utf-8";
    let (status, content_type, body) = match (method, path) {
        ("GET" | "HEAD", "/metrics") => {
            let ready = readiness.check(now).is_ok();
            metrics::gauge!(changefeed::metrics::READY).set(if ready { 1.0 } else { 0.0 });
            (
                "200 OK",
                "text/plain; version=0.0.4; charset=utf-8",
                registry.render(),
            )
        }
        ("GET" | "HEAD", "/healthz") => ("200 OK", text, "ok\n".to_owned()),
        ("GET" | "HEAD", "/readyz") => match readiness.check(now) {
            Ok(line) => ("200 OK", text, format!("{line}\n")),
            Err(line) => (
                "503 Service Unavailable",
                text,
                format!("not ready: {line}\n"),
            ),
        },
        ("GET" | "HEAD", _) => (
            "404 Not Found",
            text,
            "not found: try /metrics, /healthz or /readyz\n".to_owned(),
        ),
        _ => (
            "405 Method Not Allowed",
            text,
            "only GET and HEAD are served\n".to_owned(),
        ),
    };
    let mut response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    if method != "HEAD" {
        response.extend_from_slice(body.as_bytes());
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This process's open file descriptors.
    #[cfg(target_os = "linux")]
    fn open_fds() -> usize {
        std::fs::read_dir("/proc/self/fd").map_or(0, Iterator::count)
    }

    /// A flood of idle connections (each holding a socket of the server until its bound)
    /// costs the server at most its connection bound in file descriptors, which the relay's
    /// own connections need; once the flood's clients go, a client that trickles a request
    /// that never ends is cut off at the request's bound, and a scrape is answered.
    #[cfg(target_os = "linux")]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_flood_and_a_slow_client_are_bounded() {
        use tokio::time::Instant;

        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let ready = Arc::new(readiness(true, Duration::from_secs(10)));
        let server = tokio::spawn(serve(listener, Registry::default(), ready));

        let before = open_fds();
        // More than the server serves at once, fewer than the listener's backlog holds (a
        // flood beyond that waits in the clients' connect, retried by the kernel).
        let flood = MAX_CONNECTIONS + 100;
        let mut idle = Vec::new();
        for _ in 0..flood {
            idle.push(TcpStream::connect(address).await.unwrap());
        }
        // Time for the server to accept whatever it is going to.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let server_side = open_fds().saturating_sub(before + flood);
        assert!(
            server_side <= MAX_CONNECTIONS + 8,
            "the server holds {server_side} sockets for {flood} idle clients"
        );

        drop(idle);
        let started = Instant::now();
        let mut slow = TcpStream::connect(address).await.unwrap();
        let trickle = async {
            for byte in b"GET /healthz HTTP/1.1\r\nX: ".iter().cycle() {
                if slow.write_all(&[*byte]).await.is_err() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        };
        let _ = timeout(Duration::from_secs(20), trickle).await;
        let mut rest = Vec::new();
        let _ = timeout(Duration::from_secs(5), slow.read_to_end(&mut rest)).await;
        let cut_after = started.elapsed();
        assert!(
            cut_after < REQUEST_BOUND + Duration::from_secs(2),
            "a trickling client was served for {cut_after:?}"
        );

        let mut client = TcpStream::connect(address).await.unwrap();
        client
            .write_all(b"GET /healthz HTTP/1.1\r\n\r\n")
            .await
            .unwrap();
        let mut answer = Vec::new();
        timeout(Duration::from_secs(10), client.read_to_end(&mut answer))
            .await
            .expect("a scrape after the flood is answered")
            .unwrap();
        assert!(answer.starts_with(b"HTTP/1.1 200 OK"), "{answer:?}");
        server.abort();
    }

    fn readiness(running: bool, within: Duration) -> Readiness {
        Readiness {
            registry: Registry::default(),
            freshness: Freshness::LastClaim,
            within,
            running: AtomicBool::new(running),
        }
    }

    #[test]
    fn readiness_follows_the_last_claim() {
        let now = UNIX_EPOCH + Duration::from_secs(1_000);
        let starting = readiness(false, Duration::from_secs(10));
        assert!(starting.check(now).unwrap_err().starts_with("starting"));
        let ready = readiness(true, Duration::from_secs(10));
        assert!(
            ready
                .check(now)
                .unwrap_err()
                .contains("no successful claim")
        );
        let recorder = PrometheusRecorder(ready.registry.clone());
        metrics::with_local_recorder(&recorder, || {
            metrics::gauge!(changefeed::metrics::RELAY_LAST_CLAIM, "outbox" => "o").set(995.0);
        });
        assert!(ready.check(now).is_ok());
        let later = now + Duration::from_secs(6);
        let error = ready.check(later).unwrap_err();
        assert!(
            error.contains("11.0 s ago") && error.contains("--ready-within"),
            "{error}"
        );

        let text =
            |head: &str| String::from_utf8(respond(head, &ready.registry, &ready, now)).unwrap();
        assert!(text("GET /readyz HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 200 OK\r\n"));
        let stale = String::from_utf8(respond(
            "GET /readyz HTTP/1.1\r\n\r\n",
            &ready.registry,
            &ready,
            later,
        ))
        .unwrap();
        assert!(stale.starts_with("HTTP/1.1 503 "), "{stale}");
        assert!(text("GET /healthz HTTP/1.0\r\n\r\n").ends_with("\r\n\r\nok\n"));
        assert!(text("GET /nope HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 404 "));
        assert!(text("POST /metrics HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 405 "));
        let metrics = text("GET /metrics?x=1 HTTP/1.1\r\nHost: a\r\n\r\n");
        assert!(
            metrics.contains("Content-Type: text/plain; version=0.0.4"),
            "{metrics}"
        );
        assert!(
            metrics.contains("changefeed_relay_last_claim_timestamp_seconds{outbox=\"o\"} 995"),
            "{metrics}"
        );
        let head = text("HEAD /metrics HTTP/1.1\r\n\r\n");
        assert!(head.ends_with("\r\n\r\n"), "{head}");
    }
}
