-- Removes a consumer of a feed (all its shards' cursors and its registration), so that it no
-- longer holds purge_feed back and its name is free; returns how many cursors went. A consumer
-- removed and started again must be registered again to hold the purge back. The consumer's owner may remove it, and so
-- may a role that can delete every row of consumer_cursor (the bundle's owner, a superuser:
-- row-level security does not apply to them).
create function changefeed.remove_consumer(p_consumer text, p_feed text)
returns bigint
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    v_feed changefeed.feeds;
    v_count bigint;
begin
    perform changefeed.check_consumer(p_consumer, 0);
    v_feed := changefeed.feed_row(p_feed);
    -- The registration first: its row-level security lets a reader delete the registration of
    -- a consumer it still has cursors of. Kept, a registration would outlive the consumer it
    -- was made for: the name is free after a removal, and whoever saved under it next would
    -- get a consumer that holds purge_feed back without the feed's owner having decided so.
    delete from changefeed.registered_consumers as r
    where r.consumer = p_consumer and r.feed_id = v_feed.feed_id;
    delete from changefeed.consumer_cursor as c
    where c.consumer = p_consumer and c.feed_id = v_feed.feed_id;
    get diagnostics v_count = row_count;
    if v_count = 0 and changefeed.consumer_owner(p_consumer, v_feed.feed_id) is not null then
        raise exception using
            errcode = 'CF114',
            message = format('changefeed.remove_consumer: the consumer %L of %s belongs to the role %I',
                p_consumer, p_feed, changefeed.consumer_owner(p_consumer, v_feed.feed_id)),
            hint = 'Ask that role, or the owner of the changefeed schema, to remove it.';
    end if;
    return v_count;
end
$$;
