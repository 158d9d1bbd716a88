//! `changefeed setup-feed`: makes an event table a feed (`changefeed.setup_feed`) and says
//! how writers and readers use it.

use changefeed::Error;

use crate::args::SetupFeedArgs;
use crate::database::{Connect, with_migrate_hint};
use crate::failure::Failure;
use crate::output::Out;

/// Sets the feed up and prints how to write and read it.
pub async fn setup_feed(
    connect: &Connect,
    out: &mut Out,
    args: SetupFeedArgs,
) -> Result<(), Failure> {
    let SetupFeedArgs {
        feed,
        outbox,
        serialize_writers,
        shard_column,
        ulid_column,
    } = args;
    let mut client = connect.open(None).await?;
    let name = feed.to_string();
    client
        .query(
            "exec changefeed.setup_feed @table_name = @P1, @outbox = @P2, \
             @serialize_writers = @P3, @shard_column = @P4, @ulid_column = @P5",
            &[
                &name,
                &outbox,
                &serialize_writers,
                &shard_column.as_deref(),
                &ulid_column.as_deref(),
            ],
        )
        .await
        .map_err(Error::from)
        .map_err(with_migrate_hint)?
        .into_results()
        .await
        .map_err(Error::from)
        .map_err(with_migrate_hint)?;
    let text = match (serialize_writers, shard_column, ulid_column) {
        (true, Some(shard), Some(ulid)) => format!(
            "{feed} is a feed (serialized-writer mode: shard column {shard}, ULID column \
             {ulid})\n  writers: exec {} in the writer's transaction (role {})\n  readers: \
             exec {} (role {}), or changefeed tail {feed}\n",
            feed.object("lock_feed"),
            feed.writers_role(),
            feed.read_feed_procedure(),
            feed.readers_role()
        ),
        _ => format!(
            "{feed} is a feed (outbox mode)\n  writers: insert into {} in the event's \
             transaction (role {})\n  readers: exec {} (role {}), or changefeed tail {feed}\n",
            feed.outbox_table(),
            feed.writers_role(),
            feed.read_feed_procedure(),
            feed.readers_role()
        ),
    };
    out.text(&text)
}
