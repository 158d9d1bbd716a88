-- One row per feed and shard, for dashboards (the view changefeed.feed_status reads it):
-- outbox_depth (outbox mode: committed events not moved into the feed yet; a reader at the head
-- moves them), head_ulid and head_time (the shard's newest event), purged_through (purge_feed's
-- low-water mark). Each shard's head is one index probe.
create function changefeed.feed_status_rows()
returns table (
    feed text,
    serialize_writers boolean,
    shard_id integer,
    outbox_depth bigint,
    head_ulid bytea,
    head_time timestamptz,
    purged_through bytea
)
language plpgsql
stable
set search_path = pg_catalog, pg_temp
as $$
declare
    v_feed changefeed.feeds;
    v_table text;
begin
    for v_feed in select * from changefeed.feeds as f order by f.feed_id loop
        select format('%I.%I', n.nspname, c.relname) into v_table
        from pg_class as c join pg_namespace as n on n.oid = c.relnamespace
        where c.oid = v_feed.table_oid;
        if v_feed.serialize_writers and v_table is null then
            continue;
        end if;
        return query execute format(
            'select $1, $2, s.shard, %s, h.ulid, changefeed.ulid_time(h.ulid), st.purged_through '
            || 'from generate_series(0, $3 - 1) as s (shard) '
            || 'left join lateral (select %s as ulid from %s as x where x.%I = s.shard '
            || 'order by 1 desc limit 1) as h on true '
            || 'left join changefeed.state_%s as st on st.shard_id = s.shard',
            case when v_feed.serialize_writers then 'null::bigint' else format(
                '(select count(*) from changefeed.outbox_%s as o where o.shard_id = s.shard)',
                v_feed.feed_id) end,
            case when v_feed.serialize_writers then format('x.%I', v_feed.ulid_column) else 'x.ulid' end,
            case when v_feed.serialize_writers then v_table else format('changefeed.feed_%s', v_feed.feed_id) end,
            case when v_feed.serialize_writers then v_feed.shard_column else 'shard_id' end,
            v_feed.feed_id)
        using v_feed.name, v_feed.serialize_writers, v_feed.shards;
    end loop;
end
$$;
