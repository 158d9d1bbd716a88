//! `changefeed setup-feed`: makes an event table a feed (`changefeed.setup_feed` on SQL
//! Server or PostgreSQL) and says how writers and readers use it.

use changefeed::Error;

use crate::args::SetupFeedArgs;
use crate::database::{Connect, is_postgres, with_migrate_hint};
use crate::failure::Failure;
use crate::output::Out;

/// Sets the feed up and prints how to write and read it.
pub async fn setup_feed(
    connect: &Connect,
    out: &mut Out,
    args: SetupFeedArgs,
) -> Result<(), Failure> {
    let text = if is_postgres(&connect.url) {
        postgres(connect, args).await?
    } else {
        sql_server(connect, args).await?
    };
    out.text(&text)
}

/// The options SQL Server's `setup_feed` has no parameter for, refused in one line each.
fn sql_server_refusal(args: &SetupFeedArgs) -> Option<String> {
    if args.shards.is_some() {
        return Some(
            "--shards is for PostgreSQL, whose feeds have a shard count fixed at setup; on \
             SQL Server a writer names each event's shard (outbox mode: the outbox row's \
             shard_id; serialized: the shard column), so there is no count to give"
                .to_owned(),
        );
    }
    if args.outbox && args.shard_column.is_some() {
        return Some(
            "--shard-column with --outbox is for PostgreSQL, where a trigger copies the key \
             into the outbox; on SQL Server the writer inserts the key with its shard_id into \
             the feed's outbox itself"
                .to_owned(),
        );
    }
    None
}

async fn sql_server(connect: &Connect, args: SetupFeedArgs) -> Result<String, Failure> {
    if let Some(line) = sql_server_refusal(&args) {
        return Err(Failure::usage(line));
    }
    let SetupFeedArgs {
        feed,
        outbox,
        serialize_writers,
        shard_column,
        ulid_column,
        shards: _,
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
    Ok(match (serialize_writers, shard_column, ulid_column) {
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
    })
}

/// `setup-feed` with a `postgres://` URL: `changefeed.setup_feed(p_feed, p_shards,
/// p_serialize_writers, p_shard_column, p_ulid_column)`, then the feed's functions from
/// `changefeed.feed_info`.
#[cfg(feature = "postgres")]
async fn postgres(connect: &Connect, args: SetupFeedArgs) -> Result<String, Failure> {
    use crate::database::postgres::{call, feed_info, open, quoted_table, settings};
    use crate::output::plural;

    let SetupFeedArgs {
        feed,
        outbox: _,
        serialize_writers,
        shard_column,
        ulid_column,
        shards,
    } = args;
    let shards = i32::try_from(shards.unwrap_or(1)).unwrap_or(i32::MAX);
    if shards > 1 && shard_column.is_none() {
        return Err(Failure::usage(format!(
            "--shards {shards} needs --shard-column: on PostgreSQL each event's shard is read \
             from that column of the event table"
        )));
    }
    let config = settings(connect)?;
    let client = open(connect, &config).await?;
    let name = feed.to_string();
    call(
        "setup_feed",
        client.execute(
            "select changefeed.setup_feed($1, $2, $3, $4, $5)",
            &[
                &name,
                &shards,
                &serialize_writers,
                &shard_column.as_deref(),
                &ulid_column.as_deref(),
            ],
        ),
    )
    .await?;
    let info = feed_info(&client, &feed).await?;
    let in_shards = plural(u64::try_from(info.shards).unwrap_or(0), "shard", "shards");
    let table = quoted_table(&feed);
    let readers = format!(
        "  readers: select r.ulid, (r.key).* from {}(<shard>, <cursor>, <page size>) as r \
         (role {}), or changefeed tail {feed}\n",
        info.read_function, info.readers_role
    );
    Ok(match (info.lock_function, info.ulid_function) {
        (Some(lock), Some(ulid)) => format!(
            "{feed} is a feed on PostgreSQL (serialized-writer mode, {in_shards}: shard column \
             {}, ULID column {})\n  writers: select * from {lock}(<shard>) in the writer's \
             transaction, then {ulid}(1), {ulid}(2), … for the rows' ULIDs (role {})\n{readers}",
            shard_column.unwrap_or_default(),
            ulid_column.unwrap_or_default(),
            info.writers_role
        ),
        _ => format!(
            "{feed} is a feed on PostgreSQL (outbox mode, {in_shards}{})\n  writers: insert \
             into {table} in the event's transaction; a trigger records it (role {})\n{readers}",
            shard_column
                .map(|column| format!(", shard column {column}"))
                .unwrap_or_default(),
            info.writers_role
        ),
    })
}

#[cfg(not(feature = "postgres"))]
async fn postgres(_connect: &Connect, _args: SetupFeedArgs) -> Result<String, Failure> {
    Err(Failure::without_postgres())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::args::{Cli, Command};
    use clap::Parser;

    fn setup_args(args: &[&str]) -> SetupFeedArgs {
        let cli = Cli::try_parse_from([&["changefeed", "setup-feed"], args].concat()).unwrap();
        match cli.command {
            Command::SetupFeed(args) => args,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn sql_server_refuses_the_postgres_only_options_by_name() {
        let shards = setup_args(&["app.E", "--outbox", "--shards", "2", "--shard-column", "s"]);
        let line = sql_server_refusal(&shards).unwrap();
        assert!(line.starts_with("--shards is for PostgreSQL"), "{line}");
        let column = setup_args(&["app.E", "--outbox", "--shard-column", "s"]);
        let line = sql_server_refusal(&column).unwrap();
        assert!(line.starts_with("--shard-column with --outbox"), "{line}");
        let serialized = setup_args(&[
            "app.E",
            "--serialize-writers",
            "--shard-column",
            "s",
            "--ulid-column",
            "u",
        ]);
        assert!(sql_server_refusal(&serialized).is_none());
        assert!(sql_server_refusal(&setup_args(&["app.E", "--outbox"])).is_none());
    }
}
