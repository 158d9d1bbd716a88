-- The feed registry, the consumers' cursors (issue 28) and which consumers hold retention back:
-- what every feed function reads.
--
-- One row per feed. Per-feed objects are named after feed_id, not after the event table
-- (changefeed.feed_<id>, outbox_<id>, state_<id>, read_feed_<id>, ...): a table name may hold
-- capitals, spaces and any Unicode, and 'schema.table' can be twice PostgreSQL's 63-byte
-- identifier limit, while an id-based name needs no quoting rule of its own and always fits.
-- The event table is kept by oid: a table renamed since setup is still this feed, and one
-- dropped and re-created under the name is not (upgrade_feed reports it).
create table changefeed.feeds (
    -- Below 2^28: changefeed.shard_lock_key packs it into 28 bits.
    feed_id integer generated always as identity primary key check (feed_id < 268435456),
    -- 'schema.table' as the caller named it (catalog spelling, no case folding).
    name text not null unique,
    table_oid oid not null unique,
    serialize_writers boolean not null,
    shards integer not null check (shards between 1 and 1048576),
    -- The event table's shard column (integer): required in serialized mode and for an
    -- outbox-mode feed of more than one shard (its capture trigger files each event under
    -- the row's shard); NULL: every event is in shard 0.
    shard_column name null,
    -- Serialized mode: the event table's ULID column (bytea).
    ulid_column name null,
    -- The event table's primary key when the feed was set up, in key order; the outbox and
    -- feed tables carry these columns with the same types.
    key_columns name[] not null,
    readers_role name not null,
    writers_role name not null,
    created_at timestamptz not null default now(),
    generator_version integer not null,
    check (serialize_writers = (ulid_column is not null)),
    check (not serialize_writers or shard_column is not null)
);

-- A consumer's position per feed and shard. A consumer belongs to the role that saved its
-- first cursor of the feed (owner): every member of a feed's readers role may save cursors,
-- and a cursor steers what purge_feed deletes, so one reader must not move another's.
-- Row-level security enforces it for direct access too: a role sees and writes only its own
-- rows of feeds whose readers role it has. save_cursor reports another owner's consumer with
-- CF114 through changefeed.consumer_owner, which alone looks past the policy.
create table changefeed.consumer_cursor (
    consumer text not null check (char_length(consumer) between 1 and 200),
    feed_id integer not null references changefeed.feeds (feed_id) on delete cascade,
    shard_id integer not null,
    cursor bytea not null check (octet_length(cursor) = 16),
    owner name not null,
    updated_at timestamptz not null default now(),
    primary key (consumer, feed_id, shard_id)
);
create index consumer_cursor_feed on changefeed.consumer_cursor (feed_id, shard_id, cursor);

alter table changefeed.consumer_cursor enable row level security;
create policy consumer_cursor_own on changefeed.consumer_cursor
using (
    owner = current_user
    and exists (
        select 1 from changefeed.feeds as f
        where f.feed_id = consumer_cursor.feed_id
            and pg_catalog.pg_has_role(current_user, f.readers_role, 'USAGE')
    )
)
with check (
    owner = current_user
    and exists (
        select 1 from changefeed.feeds as f
        where f.feed_id = consumer_cursor.feed_id
            and pg_catalog.pg_has_role(current_user, f.readers_role, 'USAGE')
    )
);

-- The consumers whose saved cursors hold purge_feed back: one row per feed and consumer name.
-- Every member of a feed's readers role may save a cursor under a new consumer name
-- (save_cursor), so a saved cursor alone must not decide what retention keeps: a reader could
-- save a cursor of zeros under an invented name and stop every purge of the feed for good. A
-- consumer holds retention back only once the feed's owner registered it
-- (changefeed.register_consumer); unregister_consumer and remove_consumer undo it. A
-- registration may come before the consumer's first save.
-- feed_id cascades from the registry: teardown_feed's delete of the feed's row takes the
-- feed's registrations with it, so a feed set up again under the name starts with none.
create table changefeed.registered_consumers (
    feed_id integer not null references changefeed.feeds (feed_id) on delete cascade,
    -- The names save_cursor accepts (consumer_cursor's rule), so every consumer can be
    -- registered.
    consumer text not null check (char_length(consumer) between 1 and 200),
    registered_by name not null default current_user,
    registered_at timestamptz not null default now(),
    primary key (feed_id, consumer)
);

-- Writing it is the feed owner's (register_consumer; nobody else is granted INSERT or
-- UPDATE). setup_feed grants a feed's readers role SELECT and DELETE, which this policy
-- narrows to the registrations of consumers the reader owns (a saved cursor of its own):
-- remove_consumer, run by the consumer's owner, deletes the registration with the cursors,
-- so that the freed name does not hand whoever saves under it next a consumer that holds
-- retention back. A reader cannot see or delete another role's registration, nor the
-- registration of a name nobody has saved under yet. The table's owner and superusers are
-- not bound by row-level security.
alter table changefeed.registered_consumers enable row level security;
create policy registered_consumers_own on changefeed.registered_consumers
using (
    exists (
        select 1 from changefeed.consumer_cursor as c
        where c.feed_id = registered_consumers.feed_id
            and c.consumer = registered_consumers.consumer
            and c.owner = current_user
    )
);
