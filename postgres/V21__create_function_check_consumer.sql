-- The arguments every cursor function shares (CF110): a consumer name of 1 to 200 characters
-- without a leading or trailing space (two names that differ only there would look alike in
-- every listing), and a shard that is not negative.
create function changefeed.check_consumer(p_consumer text, p_shard integer)
returns void
language plpgsql
immutable
set search_path = pg_catalog, pg_temp
as $$
begin
    if p_consumer is null or char_length(p_consumer) not between 1 and 200
        or p_consumer <> btrim(p_consumer, ' ') or p_shard is null or p_shard < 0
    then
        raise exception using
            errcode = 'CF110',
            message = format('changefeed: consumer %s or shard %s is not usable',
                coalesce(quote_literal(p_consumer), 'NULL'), coalesce(p_shard::text, 'NULL')),
            hint = 'Name the consumer with 1 to 200 characters, without leading or trailing '
                || 'spaces, and pass a shard of the feed.';
    end if;
end
$$;
