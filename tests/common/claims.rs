//! Small helpers of the claim-outbox live tests (`live_claim_outbox`, `live_claim_wait`,
//! `live_claim_plans`, `contract_mssql`): what a claim returned, ids as T-SQL, and an
//! enqueue left open.

use changefeed::Client;
use changefeed::outbox::{Claimed, ClaimedMessage, NewMessage};
use changefeed::outbox_store::OutboxStore;

/// The messages of a claim in which every row must decode.
#[track_caller]
pub fn decoded(batch: Vec<Claimed>) -> Vec<ClaimedMessage> {
    batch
        .into_iter()
        .map(|claimed| match claimed {
            Claimed::Message(message) => message,
            Claimed::Undecodable(row) => panic!("an undecodable row: {row:?}"),
        })
        .collect()
}

/// `ids` as a T-SQL list of bigint literals.
pub fn id_list(ids: &[i64]) -> String {
    assert!(!ids.is_empty(), "an id list needs ids");
    ids.iter()
        .map(i64::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Begins a transaction on `client` and enqueues `message` in it, leaving it open; its id.
pub async fn enqueue_open(store: &OutboxStore, client: &mut Client, message: &NewMessage) -> i64 {
    super::exec(client, "begin transaction;")
        .await
        .expect("begin transaction");
    store
        .enqueue(client, message)
        .await
        .expect("enqueue in the open transaction")
        .id
}
