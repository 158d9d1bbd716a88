-- Removes a consumer of a feed (all its shards' cursors), so that it no longer holds
-- purge_feed back; returns how many cursors went. The consumer's owner may remove it, and so
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
