-- The registry row of the feed p_feed ('schema.table'), or CF006 when it is not a feed.
create function changefeed.feed_row(p_feed text)
returns changefeed.feeds
language plpgsql
stable
set search_path = pg_catalog, pg_temp
as $$
declare
    v_row changefeed.feeds;
begin
    perform changefeed.check_feed_name(p_feed);
    select * into v_row from changefeed.feeds as f where f.name = p_feed;
    if not found then
        raise exception using
            errcode = 'CF006',
            message = format('changefeed: %s is not a feed', p_feed),
            hint = 'Set it up first: select changefeed.setup_feed(''schema.table'').';
    end if;
    return v_row;
end
$$;
