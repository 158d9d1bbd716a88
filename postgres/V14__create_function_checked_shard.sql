-- The shard of an event row for an outbox-mode feed's capture trigger: the row's shard column,
-- which must be 0 .. p_shards - 1 (CF015). Refused in the writer's insert, so that an event
-- never waits in a shard no reader reads.
create function changefeed.checked_shard(p_shard integer, p_shards integer)
returns integer
language plpgsql
immutable
set search_path = pg_catalog, pg_temp
as $$
begin
    if p_shard is null or p_shard < 0 or p_shard >= p_shards then
        raise exception using
            errcode = 'CF015',
            message = format('changefeed: an event''s shard is %s; the feed has shards 0 to %s',
                coalesce(p_shard::text, 'NULL'), p_shards - 1),
            hint = 'Write the shard column of the event within that range.';
    end if;
    return p_shard;
end
$$;
