//! `changefeed purge-outbox`: deletes a claim outbox's done messages older than a cutoff
//! (`purge_done`); dead ones are kept.

use changefeed::outbox_store::OutboxStore;

use crate::args::PurgeOutboxArgs;
use crate::database::{Connect, require_outbox};
use crate::failure::Failure;
use crate::output::{Out, plural};

/// Purges and prints how many went.
pub async fn purge_outbox(
    connect: &Connect,
    out: &mut Out,
    args: PurgeOutboxArgs,
) -> Result<(), Failure> {
    let PurgeOutboxArgs {
        table,
        older_than,
        batch_size,
        max_rows,
    } = args;
    let mut client = connect.open(None).await?;
    require_outbox(&mut client, &table, "purge_done").await?;
    let outbox = OutboxStore::new(table.clone());
    let deleted = outbox
        .purge_done(&mut client, older_than.value, batch_size, max_rows)
        .await?;
    out.line(&format!(
        "deleted {} older than {older_than} from {table}",
        plural(deleted, "done message", "done messages")
    ))
}
