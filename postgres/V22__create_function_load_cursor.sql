-- The cursor a consumer saved for one shard of a feed, or NULL when it saved none. Another
-- role's consumer is refused (CF114), not reported as absent: a consumer that starts from the
-- beginning because it was given someone else's name would replay the whole feed.
create function changefeed.load_cursor(p_consumer text, p_feed text, p_shard integer)
returns bytea
language plpgsql
stable
set search_path = pg_catalog, pg_temp
as $$
declare
    v_feed changefeed.feeds;
    v_owner name;
    v_cursor bytea;
begin
    perform changefeed.check_consumer(p_consumer, p_shard);
    v_feed := changefeed.feed_row(p_feed);
    v_owner := changefeed.consumer_owner(p_consumer, v_feed.feed_id);
    if v_owner is not null and v_owner <> current_user then
        raise exception using
            errcode = 'CF114',
            message = format('changefeed.load_cursor: the consumer %L of %s belongs to the role %I',
                p_consumer, p_feed, v_owner),
            hint = 'Use a consumer name of your own.';
    end if;
    select c.cursor into v_cursor from changefeed.consumer_cursor as c
    where c.consumer = p_consumer and c.feed_id = v_feed.feed_id and c.shard_id = p_shard;
    return v_cursor;
end
$$;
