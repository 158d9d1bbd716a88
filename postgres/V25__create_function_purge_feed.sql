-- Deletes old rows of an outbox-mode feed (in serialized mode the feed is your own event table,
-- and deleting its old events is your decision), oldest first, in the caller's transaction.
-- Readers never wait for it (they read committed rows; the movers' inserts are above every row
-- it deletes). The cutoff is the earlier of:
--   p_older_than_ms  rows whose ULID time is more than this long ago (the server's clock)
--   p_before         rows whose ULID is below this one
-- Unless p_force, a shard's rows are deleted only up to the lowest cursor saved for it
-- (changefeed.save_cursor) by a registered consumer (changefeed.register_consumer, the feed
-- owner's decision): a registered consumer that is behind holds the purge back. Any member of
-- the feed's readers role may save a cursor under a new consumer name, so a consumer that is
-- not registered, or never saved a cursor, is not protected: the purge deletes past its
-- cursor, and its next read from that cursor gets CF104. Unless p_force, the caller must see
-- every cursor and registration (CF404 otherwise: READ COMMITTED, and no row-level security on
-- them: the tables' owner or a superuser), and it waits for open transactions that saved a
-- cursor of the feed or registered one of its consumers (changefeed.lock_retention), while
-- new ones wait for it: call it in a short transaction of its own.
-- At most p_max_rows rows per shard (NULL: no limit).
-- The shard's low-water mark (state.purged_through) moves to the largest ULID deleted, in the
-- same transaction; read_feed refuses a cursor below it (CF104). p_dry_run deletes nothing and
-- reports what would go. One row per shard: deleted (or would delete), purged_through, why it
-- stopped ('cutoff reached', 'held back by consumer <name>', 'max rows reached'), and
-- passed_consumers: the consumers with a saved cursor of the shard below the last row this
-- call deleted (or would delete), that is whose unread rows it deleted, in name order, NULL
-- for none. Without p_force only unregistered consumers can be passed.
create function changefeed.purge_feed(
    p_feed text,
    p_older_than_ms bigint default null,
    p_before bytea default null,
    p_shard integer default null,
    p_max_rows bigint default null,
    p_force boolean default false,
    p_dry_run boolean default false
)
returns table (shard_id integer, deleted bigint, purged_through bytea, stopped text,
    passed_consumers text[])
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
#variable_conflict use_column
declare
    v_feed changefeed.feeds := changefeed.feed_row(p_feed);
    v_cut bytea;
    v_limit bytea;
    v_holder text;
    v_held bytea;
    v_shard integer;
    v_count bigint;
    v_last bytea;
begin
    if v_feed.serialize_writers then
        raise exception using
            errcode = 'CF402',
            message = format('changefeed.purge_feed: %s has serialized writers: its feed is the '
                || 'event table itself', p_feed),
            hint = 'Delete old events from your table yourself.';
    end if;
    if (p_older_than_ms is null and p_before is null)
        or p_older_than_ms not between 0 and 3155760000000
        or octet_length(p_before) <> 16
        or p_max_rows < 1
        or (p_shard is not null and p_shard not between 0 and v_feed.shards - 1)
        or p_force is null or p_dry_run is null
    then
        raise exception using
            errcode = 'CF401',
            message = format('changefeed.purge_feed: no cutoff, or an argument out of range '
                || '(older than %s ms, before %s, shard %s, max rows %s)', p_older_than_ms,
                p_before, p_shard, p_max_rows),
            hint = 'Give p_older_than_ms (0 to 100 years) or p_before (16 bytes), a shard of '
                || 'the feed or NULL for all, and a positive max rows or NULL.';
    end if;
    if not p_force and (current_setting('transaction_isolation') <> 'read committed'
        or row_security_active('changefeed.consumer_cursor')
        or row_security_active('changefeed.registered_consumers'))
    then
        raise exception using
            errcode = 'CF404',
            message = format('changefeed.purge_feed: the role %I cannot see every registered '
                || 'consumer''s cursor of %s (isolation %s, or row-level security applies to it)',
                current_user, p_feed, current_setting('transaction_isolation')),
            hint = 'Purge under READ COMMITTED as the owner of the changefeed tables (the role that '
                || 'applied the bundle) or a superuser.';
    end if;
    if not p_force and not p_dry_run then
        -- Why no registered consumer's unread row goes, even with a registration or a cursor
        -- save committing meanwhile: this exclusive lock is held until the caller's
        -- transaction ends, and register_consumer and save_cursor hold the shared one from
        -- before their write until their own transaction ends. A registration or save that
        -- took its lock first commits (or rolls back) before this call gets past here; each
        -- holder query below is a later statement of this VOLATILE function under READ
        -- COMMITTED (checked above), so its snapshot, taken when it starts, includes that
        -- commit. One that comes later waits until this transaction has committed its
        -- deletions: it is ordered after the purge, as if made when the rows were gone. A
        -- consumer's cursor that moves forward meanwhile only makes the purge keep more.
        perform changefeed.lock_retention(v_feed.feed_id, true);
    end if;
    if p_older_than_ms is not null then
        v_cut := substring(int8send(
            floor(extract(epoch from clock_timestamp()) * 1000)::bigint - p_older_than_ms)
            from 3 for 6) || '\x00000000000000000000'::bytea;
    end if;
    if p_before is not null and (v_cut is null or p_before < v_cut) then
        v_cut := p_before;
    end if;

    for v_shard in
        select s from generate_series(coalesce(p_shard, 0), coalesce(p_shard, v_feed.shards - 1)) as s
    loop
        v_holder := null;
        v_limit := v_cut;
        if not p_force then
            -- Only registered consumers' cursors count (see the lock above for concurrency).
            select c.consumer, c.cursor into v_holder, v_held
            from changefeed.consumer_cursor as c
            join changefeed.registered_consumers as r
                on r.feed_id = c.feed_id and r.consumer = c.consumer
            where c.feed_id = v_feed.feed_id and c.shard_id = v_shard
            order by c.cursor, c.consumer
            limit 1;
            -- Rows up to and including the lowest cursor have been read by every consumer.
            if v_holder is not null and v_held < v_cut then
                v_limit := v_held || '\x00'::bytea;
            else
                v_holder := null;
            end if;
        end if;
        if p_dry_run then
            execute format('with d as (select f.ulid from changefeed.feed_%s as f where f.shard_id = $1 '
                || 'and f.ulid < $2 order by f.ulid limit $3) '
                || 'select count(*), (select d2.ulid from d as d2 order by d2.ulid desc limit 1) from d',
                v_feed.feed_id)
            into v_count, v_last using v_shard, v_limit, p_max_rows;
        else
            execute format('with d as (delete from changefeed.feed_%1$s as f where f.shard_id = $1 '
                || 'and f.ulid in (select g.ulid from changefeed.feed_%1$s as g where g.shard_id = $1 '
                || 'and g.ulid < $2 order by g.ulid limit $3) returning f.ulid) '
                || 'select count(*), (select d2.ulid from d as d2 order by d2.ulid desc limit 1) from d',
                v_feed.feed_id)
            into v_count, v_last using v_shard, v_limit, p_max_rows;
            if v_last is not null then
                execute format('insert into changefeed.state_%s as s (shard_id, purged_through) '
                    || 'values ($1, $2) on conflict (shard_id) do update set purged_through = '
                    || 'greatest(s.purged_through, excluded.purged_through)', v_feed.feed_id)
                using v_shard, v_last;
            end if;
        end if;
        shard_id := v_shard;
        deleted := v_count;
        execute format('select s.purged_through from changefeed.state_%s as s where s.shard_id = $1',
            v_feed.feed_id) into purged_through using v_shard;
        stopped := case
            when v_count = p_max_rows then 'max rows reached'
            when v_holder is not null then format('held back by consumer %s', v_holder)
            else 'cutoff reached'
        end;
        -- A consumer whose cursor is below the last row deleted had not read that row.
        select array_agg(c.consumer order by c.consumer) into passed_consumers
        from changefeed.consumer_cursor as c
        where c.feed_id = v_feed.feed_id and c.shard_id = v_shard and c.cursor < v_last;
        return next;
    end loop;
end
$$;
