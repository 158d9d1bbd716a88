//! What the relay tests share: a relay test at one batch in flight and at several (the
//! relay's fault behaviour must not depend on `max_in_flight`), and the check that a relay
//! was stopped by a publisher's fatal error.

#![allow(dead_code)] // each test file uses part of it

/// For an `async fn name(max_in_flight: u32)` of the same file, two tests that call it:
/// `name::one_batch_in_flight` (1) and `name::four_batches_in_flight` (4), each on a
/// two-worker runtime (a relay, a broker and a database at once) and with the given
/// attributes (an `#[ignore]`).
#[allow(unused_macros)] // a test file that runs its variants its own way
macro_rules! in_flight_variants {
    ($(#[$attr:meta])* $name:ident) => {
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            $(#[$attr])*
            async fn one_batch_in_flight() {
                super::$name(1).await
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            $(#[$attr])*
            async fn four_batches_in_flight() {
                super::$name(4).await
            }
        }
    };
}

/// The text of the error a relay's run returned, which must be a publisher's fatal error
/// (the one kind that stops a relay while its store and publisher still answer).
pub fn fatal_publisher_text(run: changefeed::Result<()>) -> String {
    match run.expect_err("a fatal error stops the relay") {
        changefeed::Error::Publisher(text) => text,
        other => panic!("expected a publisher error, got {other:?}"),
    }
}
