-- The checks every per-feed read function makes before it reads (CF100, CF101).
--
-- READ COMMITTED is what the read rests on: each statement of the mover sees what committed
-- before it began, so the state row it reads after taking the shard's lock is the last
-- mover's. Under REPEATABLE READ or SERIALIZABLE the whole call would see the snapshot of its
-- first statement, and could allocate ULIDs that a mover it waited for has issued already.
create function changefeed.check_read(
    p_shards integer,
    p_shard integer,
    p_cursor bytea,
    p_page_size integer
)
returns void
language plpgsql
stable
set search_path = pg_catalog, pg_temp
as $$
begin
    if current_setting('transaction_isolation') <> 'read committed' then
        raise exception using
            errcode = 'CF100',
            message = format('changefeed: read_feed needs READ COMMITTED, the transaction is %s',
                current_setting('transaction_isolation')),
            hint = 'Read in autocommit with the default isolation (set '
                || 'default_transaction_isolation = ''read committed'' for the session).';
    end if;
    if p_shard is null or p_shard < 0 or p_shard >= p_shards then
        raise exception using
            errcode = 'CF101',
            message = format('changefeed: read_feed: shard %s does not exist (the feed has '
                || 'shards 0 to %s)', coalesce(p_shard::text, 'NULL'), p_shards - 1),
            hint = 'Pass a shard from 0 to the number of shards - 1.';
    end if;
    if p_cursor is null or octet_length(p_cursor) <> 16 then
        raise exception using
            errcode = 'CF101',
            message = format('changefeed: read_feed: the cursor has %s bytes; a cursor is '
                || 'exactly 16', coalesce(octet_length(p_cursor)::text, 'no (NULL)')),
            hint = 'Pass the ulid of the last row read unchanged, or 16 zero bytes to start.';
    end if;
    if p_page_size is null or p_page_size not between 1 and 10000 then
        raise exception using
            errcode = 'CF101',
            message = format('changefeed: read_feed: page size %s is outside 1 to 10000',
                coalesce(p_page_size::text, 'NULL')),
            hint = 'Pass a page size from 1 to 10000.';
    end if;
end
$$;
