-- Takes a feed's retention lock until the caller's transaction ends: exclusive for
-- purge_feed, shared for what changes which cursors hold the purge back (save_cursor,
-- register_consumer). A purge therefore waits for every open transaction that saved a cursor
-- of the feed or registered one of its consumers, and those wait for a purge that holds it;
-- purge_feed states why that keeps every registered consumer's unread rows.
-- The key is the two-integer form, whose key space is apart from the bigint keys of
-- shard_lock_key: the class 0x63660001 ('cf', 1) and the feed id. Another application
-- collides only if it uses the same class.
create function changefeed.lock_retention(p_feed_id integer, p_exclusive boolean)
returns void
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
begin
    if p_exclusive then
        perform pg_advisory_xact_lock(1667629057, p_feed_id);
    else
        perform pg_advisory_xact_lock_shared(1667629057, p_feed_id);
    end if;
end
$$;
