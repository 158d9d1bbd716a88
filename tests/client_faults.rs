//! The client under connection faults, against a scripted fake server (tests/fake_tds):
//! why a pool cannot connect, what happens to a connection dropped inside a transaction,
//! what a check-out resets, and how the relay's claim store treats a dead session or a
//! server that stops answering.

mod fake_tds;

use std::time::{Duration, Instant};

use changefeed::outbox::{ClaimStore, ClaimedMessage};
use changefeed::outbox_store::{OutboxStore, SqlClaimStore};
use changefeed::pool::{CHECKOUT_RESET, ConnectionManager, Pool};
use changefeed::relay::{PublishOutcome, Publisher, Relay, RelayConfig, SHUTDOWN_CLAIM_GRACE};
use changefeed::{Cursor, Error, Feed, FeedReader};
use fake_tds::{FakeServer, Reply, Request, Value};
use futures::StreamExt;
use tokio::time::timeout;

/// Far below bb8's 30 s connection timeout: an answer within it did not wait for a timeout.
const PROMPTLY: Duration = Duration::from_secs(5);

fn pool_of(server: &FakeServer, max_size: u32, connection_timeout: Duration) -> Pool {
    let manager = ConnectionManager::from_ado(&server.ado()).expect("a valid ADO string");
    Pool::from_builder(
        Pool::builder()
            .max_size(max_size)
            .connection_timeout(connection_timeout),
        manager,
    )
}

fn refusing_logins(_: usize, request: &Request) -> Reply {
    match request {
        Request::Login => Reply::error(18456, 14, "Login failed for user 'app'."),
        _ => Reply::Done,
    }
}

// ---------------------------------------------------------------- why a pool cannot connect

#[tokio::test]
async fn a_refused_login_ends_the_check_out_at_once_with_the_servers_message() {
    let server = FakeServer::start(refusing_logins).await;
    let pool = pool_of(&server, 2, Duration::from_secs(30));

    let error = timeout(PROMPTLY, pool.get())
        .await
        .expect("the check-out waited for bb8's timeout")
        .map(|_| ())
        .unwrap_err();
    assert_eq!(error.server_number(), Some(18456), "{error}");
    assert!(error.is_login_failure() && !error.is_transient(), "{error}");
    assert!(
        error.to_string().contains("Login failed for user 'app'"),
        "{error}"
    );
}

#[tokio::test]
async fn a_refused_login_ends_a_feed_stream_at_once() {
    let server = FakeServer::start(refusing_logins).await;
    let pool = pool_of(&server, 1, Duration::from_secs(30));
    let feed: Feed = "app.Event".parse().unwrap();
    let reader = FeedReader::new(pool, feed);

    let mut pages = std::pin::pin!(reader.stream::<i64>(0, Cursor::START));
    let first = timeout(PROMPTLY, pages.next())
        .await
        .expect("the stream retried a refused login")
        .expect("the stream yields the error");
    let error = first.map(|_| ()).unwrap_err();
    assert_eq!(error.server_number(), Some(18456), "{error}");
    assert!(
        timeout(PROMPTLY, pages.next()).await.unwrap().is_none(),
        "the stream ends after a permanent error"
    );
}

#[tokio::test]
async fn a_server_that_hangs_up_is_named_when_the_check_out_times_out() {
    let server = FakeServer::start(|_, request| match request {
        Request::Login => Reply::Close,
        _ => Reply::Done,
    })
    .await;
    let pool = pool_of(&server, 1, Duration::from_millis(600));

    let error = pool.get().await.map(|_| ()).unwrap_err();
    let text = error.to_string();
    assert!(matches!(error, Error::Connection(_)), "{error:?}");
    assert!(error.is_transient(), "{text}");
    assert!(text.contains("the last attempt failed"), "{text}");
    assert!(server.logins() >= 1);
}

// ---------------------------------------------------------------- transactions

#[tokio::test]
async fn a_transaction_dropped_before_commit_discards_its_connection() {
    let server = FakeServer::accepting().await;
    let pool = pool_of(&server, 1, Duration::from_secs(5));
    {
        let mut conn = pool.get().await.unwrap();
        let mut tx = conn.transaction().await.unwrap();
        tx.execute("insert into app.Orders (id) values (@P1)", &[&1i64])
            .await
            .unwrap();
        // An early return: the guard is dropped without commit or rollback.
        drop(tx);
        assert!(conn.is_broken());
    }
    server
        .wait_for("the connection to be closed", |s| s.closed() == [0])
        .await;

    // The next borrower gets a fresh session, not the one with the open transaction.
    let mut conn = pool.get().await.unwrap();
    conn.simple_query("select 1").await.unwrap();
    assert_eq!(server.accepted(), 2);
    let first = server.texts_of(0);
    assert!(
        first.iter().any(|text| text.contains("begin transaction")),
        "{first:?}"
    );
    assert!(
        first
            .iter()
            .any(|text| text.contains("insert into app.Orders"))
    );
    assert!(
        first
            .iter()
            .all(|text| !text.contains("commit transaction")),
        "{first:?}"
    );
}

#[tokio::test]
async fn a_transaction_cancelled_mid_statement_discards_its_connection() {
    let server = FakeServer::start(|_, request| {
        if request.text().contains("app.Slow") {
            Reply::Hang
        } else {
            Reply::Done
        }
    })
    .await;
    let pool = pool_of(&server, 1, Duration::from_secs(5));
    {
        let mut conn = pool.get().await.unwrap();
        let mut tx = conn.transaction().await.unwrap();
        let cancelled = timeout(
            Duration::from_millis(200),
            tx.execute("update app.Slow set n = n + 1", &[]),
        )
        .await;
        assert!(cancelled.is_err(), "the statement was cut off");
    }
    server
        .wait_for("the connection to be closed", |s| s.closed() == [0])
        .await;
    let _conn = pool.get().await.unwrap();
    assert_eq!(server.accepted(), 2);
}

#[tokio::test]
async fn committed_and_rolled_back_transactions_keep_their_connection() {
    let server = FakeServer::accepting().await;
    let pool = pool_of(&server, 1, Duration::from_secs(5));
    for finish in ["commit", "rollback"] {
        let mut conn = pool.get().await.unwrap();
        let tx = conn.transaction().await.unwrap();
        if finish == "commit" {
            tx.commit().await.unwrap();
        } else {
            tx.rollback().await.unwrap();
        }
        assert!(!conn.is_broken());
    }
    let _conn = pool.get().await.unwrap();
    assert_eq!(server.accepted(), 1, "one session all along");
    assert!(server.closed().is_empty());
    let texts = server.texts_of(0);
    assert!(
        texts.iter().any(|t| t.contains("commit transaction")),
        "{texts:?}"
    );
    assert!(
        texts.iter().any(|t| t.contains("rollback transaction")),
        "{texts:?}"
    );
}

#[tokio::test]
async fn a_second_transaction_after_a_dropped_one_is_refused() {
    let server = FakeServer::accepting().await;
    let pool = pool_of(&server, 1, Duration::from_secs(5));
    let mut conn = pool.get().await.unwrap();
    drop(conn.transaction().await.unwrap());
    let error = conn.transaction().await.map(|_| ()).unwrap_err();
    assert!(matches!(error, Error::Config(_)), "{error:?}");
    assert!(error.to_string().contains("still open"), "{error}");
}

#[tokio::test]
async fn a_check_out_resets_what_a_borrower_changed() {
    let server = FakeServer::accepting().await;
    let pool = pool_of(&server, 1, Duration::from_secs(5));
    {
        let mut conn = pool.get().await.unwrap();
        conn.simple_query("set transaction isolation level serializable; set lock_timeout 0;")
            .await
            .unwrap();
    }
    let _conn = pool.get().await.unwrap();
    assert_eq!(server.accepted(), 1);
    let texts = server.texts_of(0);
    let reset = texts.last().unwrap();
    assert_eq!(reset, CHECKOUT_RESET, "{texts:?}");
    for setting in [
        "if @@trancount > 0 rollback",
        "set implicit_transactions off",
        "set transaction isolation level read committed",
        "set xact_abort off",
        "set lock_timeout -1",
    ] {
        assert!(reset.contains(setting), "{setting}: {reset}");
    }
}

// ---------------------------------------------------------------- the relay's claim store

fn store_of(server: &FakeServer) -> SqlClaimStore {
    let outbox: OutboxStore = "dbo.outbox".parse().unwrap();
    SqlClaimStore::new(outbox, server.ado())
}

/// A fake server whose RPCs naming `procedure` (on connection `on_connection` only, when one
/// is given) get `reply`, every other request success; and a claim store on it.
async fn store_failing(
    procedure: &'static str,
    on_connection: Option<usize>,
    reply: Reply,
) -> (FakeServer, SqlClaimStore) {
    let server = FakeServer::start(move |connection, request| match request {
        Request::Rpc(text)
            if text.contains(procedure) && on_connection.is_none_or(|on| on == connection) =>
        {
            reply.clone()
        }
        _ => Reply::Done,
    })
    .await;
    let store = store_of(&server);
    (server, store)
}

#[tokio::test]
async fn a_claim_store_drops_a_session_that_a_fatal_error_ended() {
    // The first claim meets error 596 (class 21: the session was killed).
    let (server, mut store) = store_failing(
        "claim:dbo.outbox",
        Some(0),
        Reply::error(
            596,
            21,
            "Cannot continue the execution because the session is in the kill state.",
        ),
    )
    .await;

    let error = store.claim(10, Duration::from_secs(30)).await.unwrap_err();
    assert_eq!(error.server_number(), Some(596));
    let batch = store.claim(10, Duration::from_secs(30)).await.unwrap();
    assert!(batch.is_empty());
    assert_eq!(
        server.accepted(),
        2,
        "the second claim ran on a fresh session"
    );
    server
        .wait_for("the dead session to be closed", |s| s.closed() == [0])
        .await;
}

#[tokio::test]
async fn a_claim_store_keeps_its_session_after_an_ordinary_error() {
    let token = changefeed::outbox::ClaimToken::from_bytes([1; 16]);
    let (server, mut store) = store_failing(
        "mark_done",
        None,
        Reply::error(
            229,
            14,
            "The EXECUTE permission was denied on the object 'mark_done:dbo.outbox'.",
        ),
    )
    .await;

    let error = store.mark_done(&[1], token).await.unwrap_err();
    assert_eq!(error.server_number(), Some(229));
    store.claim(10, Duration::from_secs(30)).await.unwrap();
    assert_eq!(server.accepted(), 1);
    assert!(server.closed().is_empty());
}

struct Nothing;

impl Publisher for Nothing {
    async fn publish(&self, batch: &[ClaimedMessage]) -> Vec<PublishOutcome> {
        vec![Ok(()); batch.len()]
    }
}

/// Runs a relay over `store`, asks it to stop after 100 ms, and returns how long `run`
/// took from then.
async fn stop_time(store: SqlClaimStore) -> Duration {
    let relay = Relay::new(store, Nothing, RelayConfig::default()).unwrap();
    let asked = std::sync::Arc::new(std::sync::Mutex::new(None::<Instant>));
    let mark = std::sync::Arc::clone(&asked);
    let shutdown = async move {
        tokio::time::sleep(Duration::from_millis(100)).await;
        *mark.lock().unwrap() = Some(Instant::now());
    };
    timeout(SHUTDOWN_CLAIM_GRACE * 3, relay.run(shutdown))
        .await
        .expect("shutdown waited for a claim that never answers")
        .unwrap();
    let asked = asked.lock().unwrap().expect("shutdown was asked");
    asked.elapsed()
}

#[tokio::test]
async fn a_relay_stops_although_its_claim_never_answers() {
    let server = FakeServer::start(|_, request| match request {
        Request::Rpc(_) => Reply::Hang,
        _ => Reply::Done,
    })
    .await;
    let took = stop_time(store_of(&server)).await;
    assert!(
        took < SHUTDOWN_CLAIM_GRACE + Duration::from_secs(2),
        "{took:?}"
    );
    assert!(
        server
            .seen()
            .iter()
            .any(|s| matches!(s.request, Request::Rpc(_)))
    );
}

#[tokio::test]
async fn a_relay_stops_at_once_while_its_claim_waits_and_cancels_it_on_the_server() {
    // The claim waits on the server (@wait_ms) until the client cancels it.
    let server = FakeServer::start(|_, request| match request {
        Request::Rpc(text) if text.contains("claim:dbo.outbox") => Reply::UntilAttention,
        _ => Reply::Done,
    })
    .await;
    let took = stop_time(store_of(&server)).await;
    assert!(took < Duration::from_secs(1), "{took:?}");
    let seen = server.seen();
    let claim = seen
        .iter()
        .position(|s| s.request.text().contains("claim:dbo.outbox"))
        .expect("the relay claimed");
    assert!(
        seen[claim].request.text().contains("@wait_ms"),
        "{:?}",
        seen[claim]
    );
    assert!(
        seen[claim..]
            .iter()
            .any(|s| s.request == Request::Attention && s.connection == seen[claim].connection),
        "no attention after the claim: {seen:?}"
    );
}

/// Claims of ids `first..first + count`, each answered after waiting `wait` with its first
/// row and, `pause` later, the rest.
fn claim_in_two_parts(first: i64, count: i64, wait: Duration, pause: Duration) -> Reply {
    Reply::RowsInTwoParts {
        columns: claim_columns(),
        rows: (first..first + count)
            .map(|id| claim_row(id, r#"{"ok":true}"#, None))
            .collect(),
        wait,
        pause,
    }
}

#[tokio::test]
async fn a_claim_says_it_answers_when_the_first_packet_of_its_result_arrives() {
    let server = FakeServer::start(|_, request| match request {
        Request::Rpc(text) if text.contains("claim:dbo.outbox") => {
            claim_in_two_parts(1, 3, Duration::from_millis(300), Duration::from_millis(300))
        }
        _ => Reply::Done,
    })
    .await;
    let mut store = store_of(&server);
    let progress = store
        .claim_progress()
        .expect("SqlClaimStore says how far its claim got");
    let claim = tokio::spawn(async move { store.claim(10, Duration::from_secs(30)).await });

    // Waiting (nothing sent back yet): a relay may stop it.
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert!(!progress.is_answering(), "answering before any answer came");
    // The first row arrived, the rest not yet: its rows are claimed, it must be let finish.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        progress.is_answering(),
        "not answering once its answer began"
    );
    let claimed = timeout(PROMPTLY, claim).await.unwrap().unwrap().unwrap();
    assert_eq!(
        claimed.iter().map(|c| c.id()).collect::<Vec<_>>(),
        [1, 2, 3]
    );
}

/// Publishes each batch in 200 ms.
struct Slow;

impl Publisher for Slow {
    async fn publish(&self, batch: &[ClaimedMessage]) -> Vec<PublishOutcome> {
        tokio::time::sleep(Duration::from_millis(200)).await;
        vec![Ok(()); batch.len()]
    }
}

/// A relay over SqlClaimStore: its second claim, beside the first batch, has its rows
/// claimed and half sent when that batch needs the store to acknowledge. The claim is not
/// cancelled (no attention before both acknowledgements, no new connection): the
/// acknowledgement waits for its answer, and its rows are published and acknowledged too.
#[tokio::test]
async fn a_relay_does_not_cancel_a_claim_whose_answer_has_begun() {
    let claims = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = std::sync::Arc::clone(&claims);
    let server = FakeServer::start(move |_, request| match request {
        Request::Rpc(text) if text.contains("claim:dbo.outbox") => {
            match counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst) {
                // A full batch: the next claim runs beside it.
                0 => claim_in_two_parts(1, 2, Duration::ZERO, Duration::ZERO),
                // Answering from the start; its batch's acknowledgement comes 200 ms in.
                1 => claim_in_two_parts(3, 2, Duration::ZERO, Duration::from_millis(1000)),
                _ => Reply::Done,
            }
        }
        Request::Rpc(text) if text.contains("mark_done:dbo.outbox") => Reply::Rows {
            columns: vec!["updated"],
            rows: vec![vec![Value::Int(2)]],
        },
        _ => Reply::Done,
    })
    .await;
    let config = RelayConfig::default().batch_size(2).max_in_flight(4);
    let relay = Relay::new(store_of(&server), Slow, config).unwrap();
    let acknowledged = |server: &FakeServer| {
        server
            .seen()
            .iter()
            .filter(|s| s.request.text().contains("mark_done:dbo.outbox"))
            .count()
    };
    let both = async {
        // Bounded: with the claim cancelled, the second batch is never acknowledged.
        let _ = timeout(Duration::from_secs(5), async {
            while acknowledged(&server) < 2 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await;
    };
    timeout(SHUTDOWN_CLAIM_GRACE * 3, relay.run(both))
        .await
        .expect("the relay stopped")
        .unwrap();

    let seen = server.seen();
    // The shutdown may cancel the claim that follows both acknowledgements (it waits for
    // rows, and a relay stops at once); only an attention before the second
    // acknowledgement cancelled the claim that was answering.
    let second_ack = seen
        .iter()
        .enumerate()
        .filter(|(_, s)| s.request.text().contains("mark_done:dbo.outbox"))
        .nth(1)
        .map_or(seen.len(), |(at, _)| at);
    assert!(
        !seen[..second_ack]
            .iter()
            .any(|s| s.request == Request::Attention),
        "the claim was cancelled while it answered: {seen:?}"
    );
    assert_eq!(server.accepted(), 1, "a new connection: {seen:?}");
    let acks: Vec<String> = seen
        .iter()
        .map(|s| s.request.text().to_owned())
        .filter(|text| text.contains("mark_done:dbo.outbox"))
        .collect();
    assert!(
        acks.len() == 2 && acks[0].contains("[1,2]") && acks[1].contains("[3,4]"),
        "acknowledged: {acks:?}"
    );
}

#[tokio::test]
async fn a_claim_without_a_wait_sends_no_wait_ms() {
    let server = FakeServer::accepting().await;
    let mut store = store_of(&server).claim_wait(Duration::ZERO).unwrap();
    assert!(!store.claim_waits());
    store.claim(10, Duration::from_secs(30)).await.unwrap();
    let texts = server.texts_of(0);
    let claim = texts
        .iter()
        .find(|t| t.contains("claim:dbo.outbox"))
        .expect("a claim");
    assert!(!claim.contains("@wait_ms"), "{claim}");
    assert!(
        store_of(&server)
            .claim_wait(Duration::from_secs(3601))
            .is_err()
    );
}

#[tokio::test]
async fn a_relay_stops_although_its_connect_never_completes() {
    // Accepts TCP connections (the kernel's backlog) and never says a word.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = silent.local_addr().unwrap().port();
    let outbox: OutboxStore = "dbo.outbox".parse().unwrap();
    let store = SqlClaimStore::new(
        outbox,
        format!("server=tcp:127.0.0.1,{port};user=app;password=x;encrypt=DANGER_PLAINTEXT"),
    );
    let took = stop_time(store).await;
    assert!(
        took < SHUTDOWN_CLAIM_GRACE + Duration::from_secs(2),
        "{took:?}"
    );
    drop(silent);
}

// ---------------------------------------------------------------- rows that do not decode

#[tokio::test]
async fn a_feed_row_that_does_not_decode_is_named_by_its_ulid() {
    use fake_tds::Value;
    let good = ulid::Ulid::from_parts(1_700_000_000_000, 1);
    let bad = ulid::Ulid::from_parts(1_700_000_000_000, 2);
    let server = FakeServer::start(move |_, request| match request {
        Request::Rpc(text) if text.contains("read_feed") => Reply::Rows {
            columns: vec!["ulid", "id"],
            rows: vec![
                vec![
                    Value::Binary(good.to_bytes().to_vec()),
                    Value::Text(Some("order-42".to_owned())),
                ],
                vec![
                    Value::Binary(bad.to_bytes().to_vec()),
                    Value::Text(None), // a NULL key: not a String
                ],
            ],
        },
        _ => Reply::Done,
    })
    .await;
    let mut client = changefeed::connect(&server.ado()).await.unwrap();
    let feed: Feed = "app.Event".parse().unwrap();

    let error = changefeed::read_page::<String>(
        &mut client,
        &feed,
        0,
        Cursor::START,
        changefeed::ReadOptions::default(),
    )
    .await
    .map(|_| ())
    .unwrap_err();
    assert!(matches!(error, Error::Decode { .. }), "{error:?}");
    assert_eq!(error.row_ulid(), Some(bad), "{error}");
    assert!(error.to_string().contains(&bad.to_string()), "{error}");
    assert!(!error.is_transient());
}

/// The columns of the claim procedure's result.
fn claim_columns() -> Vec<&'static str> {
    vec![
        "id",
        "message_id",
        "topic",
        "aggregate_type",
        "aggregate_id",
        "partition_key",
        "payload",
        "headers",
        "trace_id",
        "attempts",
        "claim_token",
    ]
}

/// One row of the claim procedure's result: message `id` with `payload` and `headers`.
fn claim_row(id: i64, payload: &str, headers: Option<&str>) -> Vec<Value> {
    vec![
        Value::BigInt(id),
        Value::Text(Some(format!("m-{id}"))),
        Value::Text(Some("orders".to_owned())),
        Value::Text(None),
        Value::Text(None),
        Value::Text(None),
        Value::Text(Some(payload.to_owned())),
        Value::Text(headers.map(str::to_owned)),
        Value::Text(None),
        Value::Int(0),
        Value::Guid([7; 16]),
    ]
}

#[tokio::test]
async fn a_claim_with_an_undecodable_row_returns_the_rest() {
    use changefeed::outbox::Claimed;
    let server = FakeServer::start(|_, request| match request {
        Request::Rpc(text) if text.contains("claim:dbo.outbox") => Reply::Rows {
            columns: claim_columns(),
            rows: vec![
                claim_row(1, "[1e400]", None),
                claim_row(2, r#"{"ok":true}"#, None),
                claim_row(3, r#"{"ok":true}"#, Some("[1,2]")),
            ],
        },
        _ => Reply::Done,
    })
    .await;
    let mut client = changefeed::connect(&server.ado()).await.unwrap();
    let outbox: OutboxStore = "dbo.outbox".parse().unwrap();
    let claimed = outbox
        .claim(&mut client, 10, Duration::from_secs(30))
        .await
        .unwrap();
    let kinds: Vec<(i64, bool)> = claimed
        .iter()
        .map(|c| (c.id(), matches!(c, Claimed::Message(_))))
        .collect();
    assert_eq!(kinds, [(1, false), (2, true), (3, false)]);
}
