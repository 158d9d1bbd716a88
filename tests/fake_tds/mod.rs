//! A scripted stand-in for SQL Server that speaks just enough TDS for tiberius to connect
//! and run batches in plain text: pre-login (encryption not supported, so the client must
//! say `encrypt=DANGER_PLAINTEXT`), login, SQL batches and RPCs, each answered by a script
//! with DONE, an ERROR token, silence, or a closed socket. It records what arrived, so a
//! test can see which batches a connection ran and when the client closed it.
//!
//! Used by the tests of the pool, the transaction guard, the claim store and `migrate`,
//! where the point is what the client does with a connection, not what the server computes.

#![allow(dead_code)] // each test file uses part of it

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

const PRELOGIN: u8 = 0x12;
const LOGIN7: u8 = 0x10;
const SQL_BATCH: u8 = 0x01;
const RPC: u8 = 0x03;
const ATTENTION: u8 = 0x06;
const TABULAR_RESULT: u8 = 0x04;

/// What the client sent, as the script sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    /// A LOGIN7 message.
    Login,
    /// A SQL batch (`simple_query`), with its text.
    Batch(String),
    /// An RPC (`query`/`execute` with parameters); `text` is the payload read as UTF-16, in
    /// which the statement text can be found with `contains`.
    Rpc(String),
    /// An attention: the client cancels the request in progress.
    Attention,
}

impl Request {
    /// The batch's or RPC's text; empty for a login.
    pub fn text(&self) -> &str {
        match self {
            Request::Login | Request::Attention => "",
            Request::Batch(text) | Request::Rpc(text) => text,
        }
    }
}

/// How the fake answers one request.
#[derive(Clone, Debug)]
pub enum Reply {
    /// Success: a DONE token.
    Done,
    /// An ERROR token with this number, class and message, then DONE with its error bit.
    Error {
        number: u32,
        class: u8,
        message: String,
    },
    /// One result set: the column names and the rows (every row has a value per column;
    /// a column's type is that of its first row's value), then DONE.
    Rows {
        columns: Vec<&'static str>,
        rows: Vec<Vec<Value>>,
    },
    /// One result set sent in two parts, as a claim that waits for work answers: nothing
    /// for `wait` (the claim waiting), then the column metadata and the first row in a
    /// packet that does not end the message, then after `pause` (the rest on its way) the
    /// other rows and DONE. An attention during either delay is answered (DONE with its
    /// attention bit) instead of the rest, and the connection serves on.
    RowsInTwoParts {
        columns: Vec<&'static str>,
        rows: Vec<Vec<Value>>,
        wait: Duration,
        pause: Duration,
    },
    /// Never answers (the connection stays open).
    Hang,
    /// Answers only an attention (a request that waits on the server until the client
    /// cancels it): DONE with its attention bit, and the connection serves on.
    UntilAttention,
    /// Closes the connection without answering.
    Close,
}

impl Reply {
    pub fn error(number: u32, class: u8, message: &str) -> Reply {
        Reply::Error {
            number,
            class,
            message: message.to_owned(),
        }
    }
}

/// A value of a result set's row.
#[derive(Clone, Debug)]
pub enum Value {
    /// `bigint`.
    BigInt(i64),
    /// `int`.
    Int(i32),
    /// `uniqueidentifier`, as its 16 wire bytes.
    Guid([u8; 16]),
    /// `nvarchar(4000)`, NULL when `None`.
    Text(Option<String>),
    /// `varbinary(8000)` (a ULID is 16 bytes of it).
    Binary(Vec<u8>),
    /// `bit` (not null).
    Bit(bool),
}

type Script = dyn Fn(usize, &Request) -> Reply + Send + Sync;

/// One request as it arrived: the connection (numbered from 0 in accept order) and what
/// was asked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Seen {
    pub connection: usize,
    pub request: Request,
}

#[derive(Default)]
struct Log {
    accepted: usize,
    seen: Vec<Seen>,
    /// Connections the client closed (EOF), in order.
    closed: Vec<usize>,
}

/// The fake server; it stops when dropped.
pub struct FakeServer {
    address: SocketAddr,
    log: Arc<Mutex<Log>>,
    task: JoinHandle<()>,
}

impl Drop for FakeServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FakeServer {
    /// Listens on 127.0.0.1 and answers with `script(connection, request)`.
    pub async fn start(
        script: impl Fn(usize, &Request) -> Reply + Send + Sync + 'static,
    ) -> FakeServer {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let address = listener.local_addr().expect("address");
        let log = Arc::new(Mutex::new(Log::default()));
        let script: Arc<Script> = Arc::new(script);
        let accept_log = Arc::clone(&log);
        let task = tokio::spawn(async move {
            loop {
                let Ok((socket, _)) = listener.accept().await else {
                    return;
                };
                let connection = {
                    let mut log = accept_log.lock().unwrap();
                    log.accepted += 1;
                    log.accepted - 1
                };
                let log = Arc::clone(&accept_log);
                let script = Arc::clone(&script);
                tokio::spawn(serve(socket, connection, log, script));
            }
        });
        FakeServer { address, log, task }
    }

    /// A server that accepts every login and answers every batch with DONE.
    pub async fn accepting() -> FakeServer {
        Self::start(|_, _| Reply::Done).await
    }

    /// The ADO.NET connection string for this server (plain text, short timeouts).
    pub fn ado(&self) -> String {
        format!(
            "server=tcp:127.0.0.1,{};user=app;password=secret;encrypt=DANGER_PLAINTEXT",
            self.address.port()
        )
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> usize {
        self.log.lock().unwrap().accepted
    }

    /// Logins received so far.
    pub fn logins(&self) -> usize {
        self.seen()
            .iter()
            .filter(|s| s.request == Request::Login)
            .count()
    }

    /// Every request so far, in arrival order.
    pub fn seen(&self) -> Vec<Seen> {
        self.log.lock().unwrap().seen.clone()
    }

    /// The texts of the batches and RPCs connection `connection` received.
    pub fn texts_of(&self, connection: usize) -> Vec<String> {
        self.seen()
            .into_iter()
            .filter(|s| s.connection == connection && s.request != Request::Login)
            .map(|s| s.request.text().to_owned())
            .collect()
    }

    /// Connections the client has closed.
    pub fn closed(&self) -> Vec<usize> {
        self.log.lock().unwrap().closed.clone()
    }

    /// Waits (up to 5 s of test time) until `condition` holds.
    pub async fn wait_for(&self, what: &str, condition: impl Fn(&FakeServer) -> bool) {
        let waited = tokio::time::timeout(Duration::from_secs(5), async {
            while !condition(self) {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await;
        assert!(waited.is_ok(), "gave up waiting for: {what}");
    }
}

async fn serve(
    mut socket: TcpStream,
    connection: usize,
    log: Arc<Mutex<Log>>,
    script: Arc<Script>,
) {
    loop {
        let Some((kind, payload)) = read_message(&mut socket).await else {
            log.lock().unwrap().closed.push(connection);
            return;
        };
        let request = match kind {
            PRELOGIN => {
                if socket
                    .write_all(&packet(&prelogin_response()))
                    .await
                    .is_err()
                {
                    return;
                }
                continue;
            }
            LOGIN7 => Request::Login,
            SQL_BATCH => Request::Batch(utf16(skip_all_headers(&payload))),
            RPC => Request::Rpc(utf16(skip_all_headers(&payload))),
            ATTENTION => {
                log.lock().unwrap().seen.push(Seen {
                    connection,
                    request: Request::Attention,
                });
                let mut tokens = Vec::new();
                done(&mut tokens, 0x0020);
                if socket.write_all(&packet(&tokens)).await.is_err() {
                    return;
                }
                continue;
            }
            other => panic!("the fake server got a packet of type {other:#x}"),
        };
        log.lock().unwrap().seen.push(Seen {
            connection,
            request: request.clone(),
        });
        let mut tokens = Vec::new();
        match script(connection, &request) {
            Reply::Done => done(&mut tokens, 0),
            Reply::Error {
                number,
                class,
                message,
            } => {
                error_token(&mut tokens, number, class, &message);
                done(&mut tokens, 0x0002);
            }
            Reply::Rows { columns, rows } => {
                result_set(&mut tokens, &columns, &rows);
                done(&mut tokens, 0x0010);
            }
            Reply::RowsInTwoParts {
                columns,
                rows,
                wait,
                pause,
            } => {
                let mut first = Vec::new();
                column_metadata(&mut first, &columns, &rows[0]);
                row(&mut first, &rows[0]);
                let sent = match until_attention(&mut socket, connection, &log, wait).await {
                    Some(false) => socket.write_all(&packets(&first, false)).await.is_ok(),
                    Some(true) => {
                        done(&mut tokens, 0x0020);
                        true
                    }
                    None => return,
                };
                if !sent {
                    return;
                }
                if tokens.is_empty() {
                    match until_attention(&mut socket, connection, &log, pause).await {
                        Some(false) => {
                            for values in &rows[1..] {
                                row(&mut tokens, values);
                            }
                            done(&mut tokens, 0x0010);
                        }
                        Some(true) => done(&mut tokens, 0x0020),
                        None => return,
                    }
                }
            }
            Reply::Hang => {
                // Keep reading so a close by the client is seen, but never answer.
                let mut sink = [0u8; 4096];
                while matches!(socket.read(&mut sink).await, Ok(n) if n > 0) {}
                log.lock().unwrap().closed.push(connection);
                return;
            }
            Reply::Close => return,
            Reply::UntilAttention => match read_message(&mut socket).await {
                Some((ATTENTION, _)) => {
                    log.lock().unwrap().seen.push(Seen {
                        connection,
                        request: Request::Attention,
                    });
                    done(&mut tokens, 0x0020);
                }
                Some((other, _)) => panic!("a request of type {other:#x} during a waiting one"),
                None => {
                    log.lock().unwrap().closed.push(connection);
                    return;
                }
            },
        }
        if socket.write_all(&packet(&tokens)).await.is_err() {
            return;
        }
    }
}

/// Waits `delay` for an attention from the client: `Some(true)` if one came (it is
/// logged), `Some(false)` if none did, `None` if the client closed the connection (logged).
async fn until_attention(
    socket: &mut TcpStream,
    connection: usize,
    log: &Mutex<Log>,
    delay: Duration,
) -> Option<bool> {
    tokio::select! {
        () = tokio::time::sleep(delay) => Some(false),
        message = read_message(socket) => match message {
            Some((ATTENTION, _)) => {
                log.lock().unwrap().seen.push(Seen {
                    connection,
                    request: Request::Attention,
                });
                Some(true)
            }
            Some((other, _)) => panic!("a request of type {other:#x} during an answer"),
            None => {
                log.lock().unwrap().closed.push(connection);
                None
            }
        },
    }
}

/// Reads one message (packets up to end-of-message): its type and payload.
async fn read_message(socket: &mut TcpStream) -> Option<(u8, Vec<u8>)> {
    let mut payload = Vec::new();
    loop {
        let mut header = [0u8; 8];
        socket.read_exact(&mut header).await.ok()?;
        let length = u16::from_be_bytes([header[2], header[3]]) as usize;
        let mut body = vec![0u8; length.checked_sub(8)?];
        socket.read_exact(&mut body).await.ok()?;
        payload.extend_from_slice(&body);
        if header[1] & 0x01 != 0 {
            return Some((header[0], payload));
        }
    }
}

/// Tabular-result packets holding `payload`, split at the default packet size (4096), the
/// last one ending the message.
fn packet(payload: &[u8]) -> Vec<u8> {
    packets(payload, true)
}

/// Tabular-result packets holding `payload`; the last one ends the message only when
/// `end_of_message` (otherwise more of the answer follows in later packets).
fn packets(payload: &[u8], end_of_message: bool) -> Vec<u8> {
    let chunks: Vec<&[u8]> = if payload.is_empty() {
        vec![payload]
    } else {
        payload.chunks(4096 - 8).collect()
    };
    let mut out = Vec::new();
    for (index, chunk) in chunks.iter().enumerate() {
        let last = end_of_message && index + 1 == chunks.len();
        let length = u16::try_from(chunk.len() + 8).expect("a chunk fits a packet");
        out.extend_from_slice(&[TABULAR_RESULT, u8::from(last)]);
        out.extend_from_slice(&length.to_be_bytes());
        out.extend_from_slice(&[0, 0, (index + 1) as u8, 0]);
        out.extend_from_slice(chunk);
    }
    out
}

/// COLMETADATA and one ROW per row.
fn result_set(out: &mut Vec<u8>, columns: &[&str], rows: &[Vec<Value>]) {
    let first = rows.first().expect("a result set with at least one row");
    column_metadata(out, columns, first);
    for values in rows {
        row(out, values);
    }
}

/// COLMETADATA, each column typed by its value in `first`: BIGINT (0x7F), INT (0x38), GUID
/// (0x24), NVARCHAR (0xE7, Latin1_General collation), BIGVARBINARY (0xA5), BIT (0x32).
fn column_metadata(out: &mut Vec<u8>, columns: &[&str], first: &[Value]) {
    out.push(0x81);
    out.extend_from_slice(&(columns.len() as u16).to_le_bytes());
    for (name, value) in columns.iter().zip(first) {
        out.extend_from_slice(&0u32.to_le_bytes()); // user type
        out.extend_from_slice(&0x0001u16.to_le_bytes()); // nullable
        match value {
            Value::BigInt(_) => out.push(0x7F),
            Value::Int(_) => out.push(0x38),
            Value::Guid(_) => out.extend_from_slice(&[0x24, 16]),
            Value::Text(_) => {
                out.push(0xE7);
                out.extend_from_slice(&8000u16.to_le_bytes());
                out.extend_from_slice(&[0x09, 0x04, 0xD0, 0x00, 0x34]);
            }
            Value::Binary(_) => {
                out.push(0xA5);
                out.extend_from_slice(&8000u16.to_le_bytes());
            }
            Value::Bit(_) => out.push(0x32),
        }
        let units: Vec<u16> = name.encode_utf16().collect();
        out.push(units.len() as u8);
        for unit in units {
            out.extend_from_slice(&unit.to_le_bytes());
        }
    }
}

/// One ROW.
fn row(out: &mut Vec<u8>, values: &[Value]) {
    out.push(0xD1);
    for value in values {
        match value {
            Value::BigInt(n) => out.extend_from_slice(&n.to_le_bytes()),
            Value::Int(n) => out.extend_from_slice(&n.to_le_bytes()),
            Value::Guid(bytes) => {
                out.push(16);
                out.extend_from_slice(bytes);
            }
            Value::Text(None) => out.extend_from_slice(&0xFFFFu16.to_le_bytes()),
            Value::Text(Some(text)) => {
                let units: Vec<u16> = text.encode_utf16().collect();
                out.extend_from_slice(&((units.len() * 2) as u16).to_le_bytes());
                for unit in units {
                    out.extend_from_slice(&unit.to_le_bytes());
                }
            }
            Value::Binary(bytes) => {
                out.extend_from_slice(&(bytes.len() as u16).to_le_bytes());
                out.extend_from_slice(bytes);
            }
            Value::Bit(bit) => out.push(u8::from(*bit)),
        }
    }
}

/// Pre-login answer: version 16.0, encryption not supported, no instance check.
fn prelogin_response() -> Vec<u8> {
    // Option table: VERSION at 11 (6 bytes), ENCRYPTION at 17 (1 byte), terminator.
    let mut out = vec![
        0x00, 0x00, 0x0B, 0x00, 0x06, 0x01, 0x00, 0x11, 0x00, 0x01, 0xFF,
    ];
    out.extend_from_slice(&[16, 0, 0, 0, 0, 0]);
    out.push(0x02); // ENCRYPT_NOT_SUP
    out
}

fn done(out: &mut Vec<u8>, status: u16) {
    out.push(0xFD);
    out.extend_from_slice(&status.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    out.extend_from_slice(&0u64.to_le_bytes());
}

fn error_token(out: &mut Vec<u8>, number: u32, class: u8, message: &str) {
    let text: Vec<u16> = message.encode_utf16().collect();
    let mut body = Vec::new();
    body.extend_from_slice(&number.to_le_bytes());
    body.push(1); // state
    body.push(class);
    body.extend_from_slice(&(text.len() as u16).to_le_bytes());
    for unit in text {
        body.extend_from_slice(&unit.to_le_bytes());
    }
    body.push(0); // server name
    body.push(0); // procedure name
    body.extend_from_slice(&1u32.to_le_bytes()); // line
    out.push(0xAA);
    out.extend_from_slice(&(body.len() as u16).to_le_bytes());
    out.extend_from_slice(&body);
}

/// A batch or RPC payload without its ALL_HEADERS block (its first 4 bytes give its size).
fn skip_all_headers(payload: &[u8]) -> &[u8] {
    let total = payload
        .get(..4)
        .map_or(0, |b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize);
    payload.get(total..).unwrap_or_default()
}

fn utf16(bytes: &[u8]) -> String {
    let units: Vec<u16> = bytes
        .chunks_exact(2)
        .map(|pair| u16::from_le_bytes([pair[0], pair[1]]))
        .collect();
    String::from_utf16_lossy(&units)
}
