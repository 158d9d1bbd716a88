-- Saves a consumer's cursor for one shard of a feed, in the caller's transaction (a consumer
-- that writes its side effects to this database saves the cursor with them: each event's
-- effect is applied exactly once). Any cursor may be saved, an earlier one too: that is how a
-- consumer rewinds to replay.
-- Who may save: members of the feed's readers role (row-level security on consumer_cursor);
-- a consumer belongs to the role of its first save (CF114 for another role). Its cursors hold
-- purge_feed back only once the feed's owner registered it (changefeed.register_consumer). The consumer name
-- is 1 to 200 characters without a leading or trailing space (CF110); the cursor exactly 16
-- bytes (CF111).
create function changefeed.save_cursor(p_consumer text, p_feed text, p_shard integer, p_cursor bytea)
returns void
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    v_feed changefeed.feeds;
    v_owner name;
begin
    perform changefeed.check_consumer(p_consumer, p_shard);
    if p_cursor is null or octet_length(p_cursor) <> 16 then
        raise exception using
            errcode = 'CF111',
            message = format('changefeed.save_cursor: the cursor has %s bytes; a cursor is exactly 16',
                coalesce(octet_length(p_cursor)::text, 'no (NULL)')),
            hint = 'Save the ulid of the last row read, or 16 zero bytes for the start.';
    end if;
    v_feed := changefeed.feed_row(p_feed);
    if p_shard >= v_feed.shards then
        raise exception using
            errcode = 'CF110',
            message = format('changefeed.save_cursor: shard %s does not exist (the feed has shards 0 to %s)',
                p_shard, v_feed.shards - 1),
            hint = 'Pass a shard of the feed.';
    end if;
    -- Consumers of one name and feed are created one at a time (the lock ends with the
    -- caller's transaction), so two roles racing on a new name cannot both own it.
    perform pg_advisory_xact_lock(hashtextextended(p_feed || '/' || p_consumer, 6366));
    v_owner := changefeed.consumer_owner(p_consumer, v_feed.feed_id);
    if v_owner is not null and v_owner <> current_user then
        raise exception using
            errcode = 'CF114',
            message = format('changefeed.save_cursor: the consumer %L of %s belongs to the role %I',
                p_consumer, p_feed, v_owner),
            hint = format('Use a consumer name of your own, or have the feed''s owner remove it: '
                || 'select changefeed.remove_consumer(%L, %L);', p_consumer, p_feed);
    end if;
    -- Shared retention lock until the caller's transaction ends: a purge of the feed that is
    -- running finishes before this cursor commits, and one that starts later sees it
    -- (purge_feed has the argument). Saves never wait for each other.
    perform changefeed.lock_retention(v_feed.feed_id, false);
    insert into changefeed.consumer_cursor as c (consumer, feed_id, shard_id, cursor, owner, updated_at)
    values (p_consumer, v_feed.feed_id, p_shard, p_cursor, current_user, now())
    on conflict (consumer, feed_id, shard_id) do update
        set cursor = excluded.cursor, updated_at = excluded.updated_at;
end
$$;
