//! A relay test at one batch in flight and at several: the relay's fault behaviour must not
//! depend on `max_in_flight`.

/// For an `async fn name(max_in_flight: u32)` of the same file, two tests that call it:
/// `name::one_batch_in_flight` (1) and `name::four_batches_in_flight` (4), each on a
/// two-worker runtime (a relay, a broker and a database at once) and with the given
/// attributes (an `#[ignore]`).
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
