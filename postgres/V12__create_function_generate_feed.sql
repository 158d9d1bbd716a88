-- Writes a feed's code: its read functions, and in serialized mode lock_feed and ulid, with
-- their grants. setup_feed calls it after creating the feed's tables; upgrade_feed calls it to
-- carry a feed to this version of the bundle. It never touches data.
--
-- Per-feed code is generated because it names the feed's tables and key columns; plpgsql then
-- plans each statement once per session, as for any function. Each function is written in
-- full below, as text with format() slots: %1$s the feed id, and lists built from the
-- registry (every name through %I). tests/live_postgres_feed.rs runs them on composite,
-- Unicode and quoted names.
--
-- Every per-feed function returns (ulid bytea, key|event composite): read_feed_<id> the key as
-- changefeed.key_<id>, read_events_<id> the event as the event table's row type, so that any
-- column name (even "ulid") comes through and an event column added later comes through
-- without regenerating. Callers expand it: select r.ulid, (r.key).* from read_feed_7(...) r.
--
-- Security: every function is SECURITY DEFINER, owned by the role that set the feed up, which
-- owns the feed's tables; PUBLIC's default EXECUTE is revoked and only the feed's readers role
-- may read, only its writers role lock. Neither role has any right on the tables themselves.
create function changefeed.generate_feed(p_feed_id integer)
returns void
language plpgsql
set search_path = pg_catalog, pg_temp
set client_min_messages = warning
as $generator$
declare
    v_feed changefeed.feeds;
    v_event text;
    v_keys_f text;
    v_keys_e text;
    v_keys_n text;
    v_keys text;
    v_join text;
    v_fast text;
    v_lock_error text;
    -- The feed's shard 0 lock key (changefeed.shard_lock_key), written into the code as a
    -- constant: the key of shard s is this + s. A call of shard_lock_key there would be
    -- planned again at every read and every lock_feed (a SQL function with a SET clause is
    -- never inlined), while the lock is about to be taken or held.
    v_lock_base constant bigint := changefeed.shard_lock_key(p_feed_id, 0);
begin
    select * into strict v_feed from changefeed.feeds as f where f.feed_id = p_feed_id;
    select format('%I.%I', n.nspname, c.relname) into v_event
    from pg_class as c join pg_namespace as n on n.oid = c.relnamespace
    where c.oid = v_feed.table_oid;
    if v_event is null then
        raise exception using
            errcode = 'CF001',
            message = format('changefeed: the event table of the feed %s was dropped', v_feed.name),
            hint = format('Tear the feed down: select changefeed.teardown_feed(%L).', v_feed.name);
    end if;

    select
        string_agg(format('f.%I', k), ', ' order by o),
        string_agg(format('e.%I', k), ', ' order by o),
        string_agg(format('n.%I', k), ', ' order by o),
        string_agg(format('%I', k), ', ' order by o),
        string_agg(format('e.%I = (r.key).%I', k, k), ' and ' order by o)
    into v_keys_f, v_keys_e, v_keys_n, v_keys, v_join
    from unnest(v_feed.key_columns) with ordinality as key_column (k, o);

    v_lock_error := 'raise exception using errcode = ''CF103'', message = format('
        || '''changefeed: read_feed: the lock of shard %s was not granted within 10 s: another '
        || 'reader held it that long, moving the outbox'', p_shard), hint = ''Transient: retry '
        || 'the call.''';

    if not v_feed.serialize_writers then
        v_fast := format(
            'return query select f.ulid, row(%2$s)::changefeed.key_%1$s from changefeed.feed_%1$s '
            || 'as f where f.shard_id = p_shard and f.ulid > p_cursor order by f.ulid limit '
            || 'p_page_size;',
            p_feed_id, v_keys_f);
        -- Outbox mode. How a page is found:
        --   1. Fast path, no lock: the feed past the cursor. Readers that are behind stop here.
        --   2. If the shard's outbox has committed rows: the shard's advisory lock, held until
        --      this call's transaction ends, so one reader at a time moves (it waits at most
        --      10 s, the function's lock_timeout: CF103, transient).
        --   3. Re-read: a reader that waited while another moved returns those rows (a lost
        --      race never yields an empty page).
        --   4. Delete up to p_page_size committed outbox rows in order_sequence order. Rows of
        --      writers that have not committed are invisible to this statement and are not
        --      waited for: a slow or abandoned writer never stalls its shard, and its row moves
        --      in a later call, after it commits.
        --   5. changefeed.assign_ulids gives them ULIDs above every ULID of the shard (the
        --      state row, read after the lock was granted, so under READ COMMITTED it holds the
        --      last mover's state); insert them into the feed, save the state, return the page.
        -- The committed feed of a shard is therefore append-only in ULID order, and
        -- ulid > cursor never skips a row that commits later. If the outbox looked empty, a
        -- mover may have committed since the fast path: one more read (3.) finds its rows.
        -- A cursor below the shard's low-water mark (purge_feed) is refused with CF104, after
        -- the page was read: a purge that commits meanwhile is caught as well.
        execute format($f$
create or replace function changefeed.read_feed_%1$s(
    p_shard integer default 0,
    p_cursor bytea default '\x00000000000000000000000000000000'::bytea,
    p_page_size integer default 1000
)
returns table (ulid bytea, key changefeed.key_%1$s)
language plpgsql
volatile
security definer
set search_path = pg_catalog, pg_temp
set lock_timeout = '10s'
as $body$
#variable_conflict use_column
declare
    v_state changefeed.state_%1$s;
    v_random record;
    v_last bytea;
begin
    perform changefeed.check_read(%2$s, p_shard, p_cursor, p_page_size);
    %3$s
    if not found then
        if exists (select 1 from changefeed.outbox_%1$s as o where o.shard_id = p_shard) then
            begin
                perform pg_advisory_xact_lock(%7$s::bigint + p_shard);
            exception when lock_not_available then
                %6$s;
            end;
            %3$s
            if not found then
                select * into v_state from changefeed.state_%1$s as s
                where s.shard_id = p_shard for update;
                v_random := changefeed.ulid_randomness();
                with taken as (
                    delete from changefeed.outbox_%1$s as o
                    where o.shard_id = p_shard and o.order_sequence in (
                        select o2.order_sequence from changefeed.outbox_%1$s as o2
                        where o2.shard_id = p_shard
                        order by o2.order_sequence
                        limit p_page_size
                    )
                    returning o.order_sequence, o.time_hint, %4$s
                ),
                numbered as (
                    select t.*, row_number() over (order by t.order_sequence) as cf_position
                    from taken as t
                ),
                assigned as (
                    select a.ordinal, a.ulid
                    from changefeed.assign_ulids(
                        (select array_agg(floor(extract(epoch from t.time_hint) * 1000)::bigint
                            order by t.order_sequence) from taken as t),
                        floor(extract(epoch from clock_timestamp()) * 1000)::bigint,
                        v_state.last_ms, v_state.ulid_high, v_state.next_counter,
                        v_random.random16, v_random.counter_draw
                    ) as a
                ),
                inserted as (
                    insert into changefeed.feed_%1$s (shard_id, ulid, %4$s)
                    select p_shard, a.ulid, %5$s
                    from numbered as n join assigned as a on a.ordinal = n.cf_position
                    returning feed_%1$s.ulid
                )
                select i.ulid into v_last from inserted as i order by i.ulid desc limit 1;
                if v_last is not null then
                    insert into changefeed.state_%1$s as s
                        (shard_id, last_ms, ulid_high, next_counter, updated_at)
                    values (
                        p_shard,
                        ('x' || encode(substring(v_last from 1 for 6), 'hex'))::bit(48)::bigint,
                        substring(v_last from 1 for 8),
                        ('x' || encode(substring(v_last from 9 for 8), 'hex'))::bit(64)::bigint + 1,
                        clock_timestamp()
                    )
                    on conflict (shard_id) do update set
                        last_ms = excluded.last_ms,
                        ulid_high = excluded.ulid_high,
                        next_counter = excluded.next_counter,
                        updated_at = excluded.updated_at;
                    %3$s
                end if;
            end if;
        else
            %3$s
        end if;
    end if;
    if p_cursor <> '\x00000000000000000000000000000000'::bytea and p_cursor < (
        select s.purged_through from changefeed.state_%1$s as s where s.shard_id = p_shard
    ) then
        raise exception using
            errcode = 'CF104',
            message = format('changefeed: read_feed: cursor expired: events after %%s in shard '
                || '%%s were purged', p_cursor, p_shard),
            hint = 'Those events are gone: resume from 16 zero bytes (the oldest retained event) '
                || 'or a later cursor. So that purge_feed keeps what the consumer has not read, save '
                || 'its cursor (changefeed.save_cursor) and ask the feed''s owner to register it '
                || '(changefeed.register_consumer): an unregistered consumer''s cursor holds nothing back.';
    end if;
end
$body$
$f$, p_feed_id, v_feed.shards, v_fast, v_keys, v_keys_n, v_lock_error, v_lock_base);

    else
        -- Serialized mode: the event table is the feed. Writers hold the shard's lock from
        -- lock_feed to their commit, so no committed row has a ULID above one that is not
        -- committed yet, and ulid > cursor never skips a row. Nothing to move, no lock.
        execute format($f$
create or replace function changefeed.read_feed_%1$s(
    p_shard integer default 0,
    p_cursor bytea default '\x00000000000000000000000000000000'::bytea,
    p_page_size integer default 1000
)
returns table (ulid bytea, key changefeed.key_%1$s)
language plpgsql
stable
security definer
set search_path = pg_catalog, pg_temp
as $body$
#variable_conflict use_column
begin
    perform changefeed.check_read(%2$s, p_shard, p_cursor, p_page_size);
    return query
    select e.%4$I, row(%5$s)::changefeed.key_%1$s
    from %6$s as e
    where e.%3$I = p_shard and e.%4$I > p_cursor
    order by e.%4$I
    limit p_page_size;
end
$body$
$f$, p_feed_id, v_feed.shards, v_feed.shard_column, v_feed.ulid_column, v_keys_e, v_event);


        -- lock_feed: inside the writer's transaction, takes the shard's advisory lock (held
        -- until the transaction ends, so every writer of the shard queues here and commit
        -- order is ULID order), reserves 10^11 ULIDs from the state row with the allocator of
        -- outbox mode, and records the range in the transaction-local setting
        -- changefeed.ulid_<id> for ulid_<id>(i). A rollback to a savepoint taken before the
        -- call undoes the setting together with the state row, so a range the shard no longer
        -- records cannot be handed out. One shard of a feed per transaction (CF203): ulid(i)
        -- has no shard argument. p_lock_timeout_ms: -1 waits as long as it takes (within the
        -- session's statement_timeout). A time hint later than the server's clock + 1 s
        -- counts as that instant.
        execute format($f$
create or replace function changefeed.lock_feed_%1$s(
    p_shard integer default 0,
    p_time_hint timestamptz default null,
    p_lock_timeout_ms integer default -1
)
returns table (ulid bytea, ulid_high bytea, ulid_low bigint)
language plpgsql
volatile
security definer
set search_path = pg_catalog, pg_temp
as $body$
#variable_conflict use_column
declare
    v_previous text := current_setting('changefeed.ulid_%1$s', true);
    v_timeout text := current_setting('lock_timeout');
    v_state changefeed.state_%1$s;
    v_random record;
    v_first bytea;
    v_low bigint;
begin
    if p_shard is null or p_shard < 0 or p_shard >= %2$s
        or p_lock_timeout_ms is null or p_lock_timeout_ms < -1
        or not isfinite(coalesce(p_time_hint, clock_timestamp()))
    then
        raise exception using
            errcode = 'CF201',
            message = format('changefeed: lock_feed: shard %%s, lock timeout %%s ms or time '
                || 'hint %%s is out of range', p_shard, p_lock_timeout_ms, p_time_hint),
            hint = 'Pass a shard from 0 to %3$s, a lock timeout of -1 (wait) or >= 0 ms, and a '
                || 'finite time hint or NULL.';
    end if;
    if coalesce(v_previous, '') <> ''
        and split_part(v_previous, ':', 3) = pg_current_xact_id()::text
        and split_part(v_previous, ':', 2) <> p_shard::text
    then
        raise exception using
            errcode = 'CF203',
            message = format('changefeed: lock_feed: this transaction already locked shard %%s '
                || 'of this feed, and ulid(i) serves one shard per transaction',
                split_part(v_previous, ':', 2)),
            hint = 'Write each shard of a feed in a transaction of its own.';
    end if;
    perform set_config('lock_timeout',
        case when p_lock_timeout_ms = -1 then '0' else p_lock_timeout_ms::text end, true);
    begin
        perform pg_advisory_xact_lock(%4$s::bigint + p_shard);
    exception when lock_not_available then
        raise exception using
            errcode = 'CF202',
            message = format('changefeed: lock_feed: shard %%s is locked by another writer''s '
                || 'transaction and was not granted within %%s ms', p_shard, p_lock_timeout_ms),
            hint = 'Transient: roll back and retry the whole transaction.';
    end;
    perform set_config('lock_timeout', v_timeout, true);

    select * into v_state from changefeed.state_%1$s as s where s.shard_id = p_shard for update;
    v_random := changefeed.ulid_randomness();
    select a.ulid into v_first
    from changefeed.assign_ulids(
        array[floor(extract(epoch from coalesce(p_time_hint, clock_timestamp())) * 1000)::bigint],
        floor(extract(epoch from clock_timestamp()) * 1000)::bigint,
        v_state.last_ms, v_state.ulid_high, v_state.next_counter,
        v_random.random16, v_random.counter_draw
    ) as a;
    v_low := ('x' || encode(substring(v_first from 9 for 8), 'hex'))::bit(64)::bigint;
    insert into changefeed.state_%1$s as s (shard_id, last_ms, ulid_high, next_counter, updated_at)
    values (
        p_shard,
        ('x' || encode(substring(v_first from 1 for 6), 'hex'))::bit(48)::bigint,
        substring(v_first from 1 for 8),
        v_low + 100000000000,
        clock_timestamp()
    )
    on conflict (shard_id) do update set
        last_ms = excluded.last_ms,
        ulid_high = excluded.ulid_high,
        next_counter = excluded.next_counter,
        updated_at = excluded.updated_at;
    perform set_config('changefeed.ulid_%1$s',
        encode(v_first, 'hex') || ':' || p_shard || ':' || pg_current_xact_id()::text, true);
    return query select v_first, substring(v_first from 1 for 8), v_low;
end
$body$
$f$, p_feed_id, v_feed.shards, v_feed.shards - 1, v_lock_base);

        -- ulid_<id>(i): the i-th ULID (1-based) of the range lock_feed reserved in this
        -- transaction. The setting is transaction-local: after the transaction, or after a
        -- rollback to a savepoint that undid lock_feed, there is no range (CF204). The
        -- transaction id in it guards against a session setting it by hand across
        -- transactions. It reads a setting only, so it needs no rights (SECURITY INVOKER).
        execute format($f$
create or replace function changefeed.ulid_%1$s(p_i bigint)
returns bytea
language plpgsql
stable
set search_path = pg_catalog, pg_temp
as $body$
declare
    v_range text := current_setting('changefeed.ulid_%1$s', true);
    v_first bytea;
begin
    if coalesce(v_range, '') = ''
        or split_part(v_range, ':', 3) <> coalesce(pg_current_xact_id_if_assigned()::text, '')
    then
        raise exception using
            errcode = 'CF204',
            message = 'changefeed: ulid(i) needs lock_feed of this feed earlier in the same '
                || 'transaction (none, or undone by a rollback to a savepoint)',
            hint = 'Call lock_feed first, inside the writer''s transaction.';
    end if;
    if p_i is null or p_i < 1 or p_i > 100000000000 then
        raise exception using
            errcode = 'CF204',
            message = format('changefeed: ulid(i): i = %%s is outside 1 to 100000000000, the '
                || 'range lock_feed reserved', p_i),
            hint = 'Number the rows of the transaction from 1.';
    end if;
    v_first := decode(split_part(v_range, ':', 1), 'hex');
    return substring(v_first from 1 for 8) || int8send(
        ('x' || encode(substring(v_first from 9 for 8), 'hex'))::bit(64)::bigint + p_i - 1);
end
$body$
$f$, p_feed_id);

        execute format('revoke all on function changefeed.lock_feed_%s(integer, timestamptz, '
            || 'integer) from public', p_feed_id);
        execute format('revoke all on function changefeed.ulid_%s(bigint) from public', p_feed_id);
        execute format('grant execute on function changefeed.lock_feed_%s(integer, timestamptz, '
            || 'integer) to %I', p_feed_id, v_feed.writers_role);
        execute format('grant execute on function changefeed.ulid_%s(bigint) to %I',
            p_feed_id, v_feed.writers_role);
    end if;

    -- Both modes: the page of read_feed_<id> joined to the event rows by key (a left join: an
    -- event deleted since it was written still yields its ulid, with a NULL event, so the
    -- reader's cursor moves past it).
    -- Two statements, not one. Under READ COMMITTED a statement sees what was committed when
    -- it began, while read_feed_<id> (volatile) reads with snapshots of its own, taken later:
    -- it moves outbox rows committed after the calling statement began. A join in the
    -- statement that calls it would not see those writers' event rows and would return their
    -- events as deleted (tests/live_postgres_feed.rs,
    -- read_events_returns_every_event_that_its_call_moved). The join below is a statement of
    -- its own, begun after read_feed_<id> returned, so it sees every event whose row moved.
    execute format($f$
create or replace function changefeed.read_events_%1$s(
    p_shard integer default 0,
    p_cursor bytea default '\x00000000000000000000000000000000'::bytea,
    p_page_size integer default 1000
)
returns table (ulid bytea, event %2$s)
language plpgsql
volatile
security definer
set search_path = pg_catalog, pg_temp
as $body$
#variable_conflict use_column
declare
    v_ulids bytea[];
    v_keys changefeed.key_%1$s[];
begin
    select array_agg(p.ulid order by p.ulid), array_agg(p.key order by p.ulid)
    into v_ulids, v_keys
    from changefeed.read_feed_%1$s(p_shard, p_cursor, p_page_size) as p;
    return query
    select r.ulid, e
    from (
        -- By position: an unnest of both arrays at once would expand the key's columns.
        select u.ulid, v_keys[u.n] as key
        from unnest(v_ulids) with ordinality as u (ulid, n)
    ) as r
    left join %2$s as e on %3$s
    order by r.ulid;
end
$body$
$f$, p_feed_id, v_event, v_join);

    execute format('revoke all on function changefeed.read_feed_%s(integer, bytea, integer) '
        || 'from public', p_feed_id);
    execute format('revoke all on function changefeed.read_events_%s(integer, bytea, integer) '
        || 'from public', p_feed_id);
    execute format('grant execute on function changefeed.read_feed_%s(integer, bytea, integer) '
        || 'to %I', p_feed_id, v_feed.readers_role);
    execute format('grant execute on function changefeed.read_events_%s(integer, bytea, integer) '
        || 'to %I', p_feed_id, v_feed.readers_role);
    update changefeed.feeds set generator_version = 1 where feed_id = p_feed_id;
end
$generator$;
