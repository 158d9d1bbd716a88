//! A relay test at one batch in flight and at several: the relay's fault behaviour must not
//! depend on `max_in_flight`.

/// For an `async fn name(max_in_flight: u32)` of the same file, two tests that call it:
/// `name::one_batch_in_flight` (1) and `name::four_batches_in_flight` (4), each with the
/// given attributes (the test attribute, an `#[ignore]`).
macro_rules! in_flight_variants {
    ($(#[$attr:meta])* $name:ident) => {
        mod $name {
            $(#[$attr])*
            async fn one_batch_in_flight() {
                super::$name(1).await
            }

            $(#[$attr])*
            async fn four_batches_in_flight() {
                super::$name(4).await
            }
        }
    };
}
