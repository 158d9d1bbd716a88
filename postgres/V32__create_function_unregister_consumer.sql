-- Undoes register_consumer: the consumer's saved cursors of the feed no longer hold
-- purge_feed back (they stay saved; remove_consumer deletes them). Returns true when a
-- registration was deleted, false when there was none.
-- Who may: as register_consumer, the feed's owner (CF116 for anyone else).
create function changefeed.unregister_consumer(p_consumer text, p_feed text)
returns boolean
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    v_feed changefeed.feeds;
    v_count bigint;
begin
    perform changefeed.check_consumer(p_consumer, 0);
    v_feed := changefeed.feed_row(p_feed);
    perform changefeed.check_feed_owner('unregister_consumer', v_feed);
    -- No retention lock: a purge that still counts this consumer keeps more, never less.
    delete from changefeed.registered_consumers as r
    where r.feed_id = v_feed.feed_id and r.consumer = p_consumer;
    get diagnostics v_count = row_count;
    return v_count > 0;
end
$$;
