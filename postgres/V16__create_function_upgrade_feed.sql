-- Regenerates the code of the feed p_feed with this version of the bundle (generate_feed);
-- tables and data are untouched. Refused when the event table is gone (CF001) or its primary
-- key is no longer the one the feed's tables carry (CF014): the code would not fit them.
create function changefeed.upgrade_feed(p_feed text)
returns void
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    v_feed changefeed.feeds := changefeed.feed_row(p_feed);
    v_keys name[];
begin
    perform pg_advisory_xact_lock(changefeed.shard_lock_key(0, 0));
    select array_agg(a.attname order by k.position) into v_keys
    from pg_index as i
    cross join lateral unnest(i.indkey) with ordinality as k (attnum, position)
    join pg_attribute as a on a.attrelid = i.indrelid and a.attnum = k.attnum
    where i.indrelid = v_feed.table_oid and i.indisprimary;
    if not exists (select 1 from pg_class as c where c.oid = v_feed.table_oid) then
        raise exception using
            errcode = 'CF001',
            message = format('changefeed.upgrade_feed: the event table of %s was dropped', p_feed),
            hint = format('Tear the feed down: select changefeed.teardown_feed(%L);', p_feed);
    end if;
    if v_keys is distinct from v_feed.key_columns then
        raise exception using
            errcode = 'CF014',
            message = format('changefeed.upgrade_feed: the primary key of %s is now (%s), the '
                || 'feed''s tables carry (%s)', p_feed, array_to_string(v_keys, ', '),
                array_to_string(v_feed.key_columns, ', ')),
            hint = 'Restore the key, or tear the feed down and set it up again.';
    end if;
    perform changefeed.generate_feed(v_feed.feed_id);
end
$$;
