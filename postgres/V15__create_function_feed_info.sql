-- What a client needs to read or write the feed p_feed: its id and shape, the names of its
-- functions (schema-qualified and quoted, ready to call), its NOTIFY channel and its roles.
-- CF006 when it is not a feed. Readers and writers may call it (it reads the registry, which
-- holds names only).
create function changefeed.feed_info(p_feed text)
returns table (
    feed_id integer,
    serialize_writers boolean,
    shards integer,
    key_columns text[],
    read_function text,
    events_function text,
    lock_function text,
    ulid_function text,
    channel text,
    readers_role text,
    writers_role text
)
language plpgsql
stable
security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    v_feed changefeed.feeds := changefeed.feed_row(p_feed);
begin
    return query select
        v_feed.feed_id,
        v_feed.serialize_writers,
        v_feed.shards,
        v_feed.key_columns::text[],
        format('changefeed.read_feed_%s', v_feed.feed_id),
        format('changefeed.read_events_%s', v_feed.feed_id),
        case when v_feed.serialize_writers then format('changefeed.lock_feed_%s', v_feed.feed_id) end,
        case when v_feed.serialize_writers then format('changefeed.ulid_%s', v_feed.feed_id) end,
        format('changefeed_feed_%s', v_feed.feed_id),
        v_feed.readers_role::text,
        v_feed.writers_role::text;
end
$$;
