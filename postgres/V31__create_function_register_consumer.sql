-- Registers the consumer p_consumer of the feed p_feed, so that its saved cursors hold
-- purge_feed back (registered_consumers says why a saved cursor alone does not). Idempotent:
-- returns true when this call registered it, false when it already was.
-- Who may: the feed's owner (changefeed.check_feed_owner, CF116 for anyone else, a member of
-- only the readers role among them) with INSERT on changefeed.registered_consumers, which the
-- role that applied the bundle has and grants no one.
-- The consumer may not have saved a cursor yet (register it before it starts): its first
-- save makes it the saving role's, as always, and from then on its cursors hold the purge
-- back. changefeed.consumer_lag shows holds_retention for every saved cursor.
create function changefeed.register_consumer(p_consumer text, p_feed text)
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
    perform changefeed.check_feed_owner('register_consumer', v_feed);
    -- Shared retention lock: a purge running now finishes before this registration commits,
    -- and one that starts later sees it (purge_feed has the argument).
    perform changefeed.lock_retention(v_feed.feed_id, false);
    insert into changefeed.registered_consumers (feed_id, consumer)
    values (v_feed.feed_id, p_consumer)
    on conflict (feed_id, consumer) do nothing;
    get diagnostics v_count = row_count;
    return v_count > 0;
end
$$;
