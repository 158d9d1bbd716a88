//! Small helpers of the claim-outbox live tests (`live_claim_outbox`, `live_claim_wait`,
//! `contract_mssql`): what a claim returned, and ids as T-SQL.

use changefeed::outbox::{Claimed, ClaimedMessage};

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
