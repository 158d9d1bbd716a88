-- Makes the table p_feed ('schema.table') a feed, and returns its id:
--   select changefeed.setup_feed('app.events');                         -- outbox mode, 1 shard
--   select changefeed.setup_feed('app.events', 4, p_shard_column => 'shard');
--   select changefeed.setup_feed('app.orders', 4, true, 'shard', 'ulid'); -- serialized writers
-- Call it from your own migrations, as the role that owns the event table (or one that may
-- SELECT it and create triggers on it): that role owns the feed's objects.
--
-- Outbox mode: writers just insert into the event table; a statement trigger copies the
-- inserted rows' keys (and shard, from p_shard_column) into the feed's outbox, in the same
-- transaction, and the first reader at the head moves committed outbox rows into the feed.
-- Serialized mode: the event table carries its shard (integer) and ULID (bytea) columns with a
-- unique index on exactly (shard, ulid); writers call lock_feed_<id> and number their rows
-- with ulid_<id>(i) (see generate_feed).
-- Both: readers are woken by NOTIFY on the channel changefeed_feed_<id> at each writing commit.
--
-- Creates: the composite type key_<id>, the tables state_<id> (and in outbox mode outbox_<id>
-- and feed_<id>), the triggers on the event table, the roles changefeed_<db oid>_<id>_readers
-- and _writers (NOLOGIN: grant them to your logins; this needs CREATEROLE), then the code
-- (generate_feed). Idempotent: the same call again regenerates the code and changes nothing
-- else; another mode, shard count or column is CF005 (tear the feed down first).
-- Generator calls are serialized by an advisory lock, so concurrent setups cannot race.
create function changefeed.setup_feed(
    p_feed text,
    p_shards integer default 1,
    p_serialize_writers boolean default false,
    p_shard_column text default null,
    p_ulid_column text default null
)
returns integer
language plpgsql
set search_path = pg_catalog, pg_temp
set client_min_messages = warning
as $$
declare
    v_parts constant text[] := changefeed.check_feed_name(p_feed);
    v_oid oid;
    v_qualified text;
    v_keys name[];
    v_declarations text;
    v_existing changefeed.feeds;
    v_id integer;
    v_readers name;
    v_writers name;
    v_type oid;
    v_bad text;
    v_db oid;
begin
    -- The generators' lock (class 'cf', key 0: no feed has id 0).
    perform pg_advisory_xact_lock(changefeed.shard_lock_key(0, 0));

    select c.oid, format('%I.%I', n.nspname, c.relname) into v_oid, v_qualified
    from pg_class as c join pg_namespace as n on n.oid = c.relnamespace
    where n.nspname = v_parts[1] and c.relname = v_parts[2] and c.relkind in ('r', 'p');
    if v_oid is null then
        raise exception using
            errcode = 'CF001',
            message = format('changefeed.setup_feed: there is no table %I.%I', v_parts[1], v_parts[2]),
            hint = 'Create the table first (names are matched exactly, without case folding); '
                || 'for a view, set the feed up on the table it reads.';
    end if;

    select array_agg(a.attname order by k.position) into v_keys
    from pg_index as i
    cross join lateral unnest(i.indkey) with ordinality as k (attnum, position)
    join pg_attribute as a on a.attrelid = i.indrelid and a.attnum = k.attnum
    where i.indrelid = v_oid and i.indisprimary;
    if v_keys is null then
        raise exception using
            errcode = 'CF002',
            message = format('changefeed.setup_feed: %s has no primary key', v_qualified),
            hint = 'Add one: the outbox and the feed carry the event''s key.';
    end if;

    if p_shards is null or p_shards not between 1 and 1048576
        or p_serialize_writers is null
        or (p_serialize_writers and (p_shard_column is null or p_ulid_column is null))
        or (not p_serialize_writers and p_ulid_column is not null)
        or (not p_serialize_writers and p_shards > 1 and p_shard_column is null)
    then
        raise exception using
            errcode = 'CF004',
            message = format('changefeed.setup_feed: the mode arguments do not fit (shards %s, '
                || 'serialize_writers %s, shard column %s, ulid column %s)', p_shards,
                p_serialize_writers, p_shard_column, p_ulid_column),
            hint = 'Outbox mode: 1 to 1048576 shards, a shard column when more than one, no ulid '
                || 'column. Serialized writers: p_serialize_writers => true with both columns.';
    end if;

    -- Column types: the shard column integer (not null is the table's business: a NULL
    -- shard is refused by the capture trigger), the ULID column bytea.
    select string_agg(problem, '; ') into v_bad from (
        select format('%I is not a column', c.name) as problem
        from unnest(array[p_shard_column, p_ulid_column]) as c (name)
        where c.name is not null and not exists (
            select 1 from pg_attribute as a
            where a.attrelid = v_oid and a.attname = c.name and a.attnum > 0 and not a.attisdropped)
        union all
        select format('the shard column %I is %s, not integer', a.attname, format_type(a.atttypid, a.atttypmod))
        from pg_attribute as a
        where a.attrelid = v_oid and a.attname = p_shard_column and a.atttypid <> 'integer'::regtype
        union all
        select format('the ULID column %I is %s, not bytea', a.attname, format_type(a.atttypid, a.atttypmod))
        from pg_attribute as a
        where a.attrelid = v_oid and a.attname = p_ulid_column and a.atttypid <> 'bytea'::regtype
    ) as problems;
    if v_bad is not null then
        raise exception using
            errcode = 'CF010',
            message = format('changefeed.setup_feed: %s: %s', v_qualified, v_bad),
            hint = 'The shard column must be integer and the ULID column bytea.';
    end if;
    if p_serialize_writers and not exists (
        select 1 from pg_index as i
        where i.indrelid = v_oid and i.indisunique and i.indpred is null and i.indexprs is null
            and i.indnatts = 2
            and (select array_agg(a.attname order by k.position)
                 from unnest(i.indkey) with ordinality as k (attnum, position)
                 join pg_attribute as a on a.attrelid = v_oid and a.attnum = k.attnum)
                = array[p_shard_column, p_ulid_column]::name[]
    ) then
        raise exception using
            errcode = 'CF011',
            message = format('changefeed.setup_feed: %s has no unique index on exactly (%I, %I)',
                v_qualified, p_shard_column, p_ulid_column),
            hint = format('Create it: create unique index on %s (%I, %I);', v_qualified,
                p_shard_column, p_ulid_column);
    end if;
    if not p_serialize_writers and v_keys && array['shard_id', 'ulid', 'order_sequence', 'time_hint', 'cf_position']::name[] then
        raise exception using
            errcode = 'CF008',
            message = format('changefeed.setup_feed: a key column of %s is named shard_id, ulid, '
                || 'order_sequence, time_hint or cf_position, which the feed''s tables use', v_qualified),
            hint = 'Rename the key column.';
    end if;
    if not has_table_privilege(v_oid, 'SELECT') or not has_table_privilege(v_oid, 'TRIGGER') then
        raise exception using
            errcode = 'CF013',
            message = format('changefeed.setup_feed: the role %I may not SELECT %s or create '
                || 'triggers on it; the feed''s functions run with this role''s rights',
                current_user, v_qualified),
            hint = 'Run setup_feed as the table''s owner, or grant SELECT and TRIGGER on it.';
    end if;

    select * into v_existing from changefeed.feeds as f where f.name = p_feed or f.table_oid = v_oid;
    if found then
        if v_existing.name = p_feed and v_existing.table_oid = v_oid
            and v_existing.serialize_writers = p_serialize_writers
            and v_existing.shards = p_shards
            and v_existing.shard_column is not distinct from p_shard_column::name
            and v_existing.ulid_column is not distinct from p_ulid_column::name
            and v_existing.key_columns = v_keys
        then
            perform changefeed.generate_feed(v_existing.feed_id);
            return v_existing.feed_id;
        end if;
        raise exception using
            errcode = 'CF005',
            message = format('changefeed.setup_feed: %s is already the feed %s with other '
                || 'arguments (or another table had this name)', v_qualified, v_existing.name),
            hint = format('Tear it down first (this drops its history): select '
                || 'changefeed.teardown_feed(%L);', v_existing.name);
    end if;

    insert into changefeed.feeds (name, table_oid, serialize_writers, shards, shard_column,
        ulid_column, key_columns, readers_role, writers_role, generator_version)
    values (p_feed, v_oid, p_serialize_writers, p_shards, p_shard_column, p_ulid_column, v_keys,
        '-', '-', 0)
    returning feed_id into v_id;
    select d.oid into strict v_db from pg_database as d where d.datname = current_database();
    v_writers := format('changefeed_%s_%s_writers', v_db, v_id);
    v_readers := format('changefeed_%s_%s_readers', v_db, v_id);
    update changefeed.feeds set readers_role = v_readers, writers_role = v_writers
    where feed_id = v_id;
    foreach v_bad in array array[v_readers, v_writers] loop
        if not exists (select 1 from pg_roles where rolname = v_bad) then
            execute format('create role %I nologin', v_bad);
        end if;
        execute format('grant usage on schema changefeed to %I', v_bad);
    end loop;
    execute format('grant select on changefeed.feeds to %I', v_readers);
    execute format('grant select, insert, update, delete on changefeed.consumer_cursor to %I', v_readers);
    -- Only to delete the registrations of their own consumers (remove_consumer): the table's
    -- row-level security shows a reader nothing else, and registering is the feed owner's.
    execute format('grant select, delete on changefeed.registered_consumers to %I', v_readers);

    -- The key's columns with their types and collations.
    select string_agg(format('%I %s%s', a.attname, format_type(a.atttypid, a.atttypmod),
            case when a.attcollation <> 0 and a.attcollation <> t.typcollation
                then (select format(' collate %I.%I', cn.nspname, co.collname)
                      from pg_collation as co join pg_namespace as cn on cn.oid = co.collnamespace
                      where co.oid = a.attcollation)
                else '' end), ', ' order by k.position)
    into v_declarations
    from unnest(v_keys) with ordinality as k (name, position)
    join pg_attribute as a on a.attrelid = v_oid and a.attname = k.name
    join pg_type as t on t.oid = a.atttypid;

    execute format('create type changefeed.key_%s as (%s)', v_id, v_declarations);
    execute format('create table changefeed.state_%s ('
        'shard_id integer primary key, last_ms bigint, ulid_high bytea, next_counter bigint, '
        'purged_through bytea not null default %L::bytea, updated_at timestamptz)',
        v_id, '\x00000000000000000000000000000000');

    if not p_serialize_writers then
        execute format('create table changefeed.outbox_%s ('
            'shard_id integer not null check (shard_id >= 0 and shard_id < %s), '
            'order_sequence bigint generated always as identity, '
            'time_hint timestamptz not null default clock_timestamp() check (isfinite(time_hint)), '
            '%s, primary key (shard_id, order_sequence))', v_id, p_shards, v_declarations);
        execute format('create table changefeed.feed_%s ('
            'shard_id integer not null, ulid bytea not null, %s, primary key (shard_id, ulid))',
            v_id, v_declarations);
        -- Writers may also insert into the outbox themselves (the keys and a shard).
        execute format('grant insert on changefeed.outbox_%s to %I', v_id, v_writers);
        -- The capture trigger: one statement-level trigger with the inserted rows as a
        -- transition table, so a multi-row insert costs one trigger call.
        execute format($f$
create function changefeed.capture_%1$s()
returns trigger
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $body$
begin
    insert into changefeed.outbox_%1$s (shard_id, %2$s)
    select %3$s, %4$s from inserted_rows as n;
    return null;
end
$body$
$f$, v_id,
            (select string_agg(format('%I', k), ', ' order by o) from unnest(v_keys) with ordinality as x (k, o)),
            case when p_shard_column is null then '0'
                else format('changefeed.checked_shard(n.%I, %s)', p_shard_column, p_shards) end,
            (select string_agg(format('n.%I', k), ', ' order by o) from unnest(v_keys) with ordinality as x (k, o)));
        execute format('revoke all on function changefeed.capture_%s() from public', v_id);
        execute format('create trigger %I after insert on %s referencing new table as inserted_rows '
            'for each statement execute function changefeed.capture_%s()',
            format('changefeed_capture_%s', v_id), v_qualified, v_id);
        execute format('create trigger changefeed_notify after insert on changefeed.outbox_%s '
            'for each statement execute function changefeed.notify(%L)',
            v_id, format('changefeed_feed_%s', v_id));
    else
        execute format('create trigger %I after insert on %s for each statement '
            'execute function changefeed.notify(%L)',
            format('changefeed_notify_%s', v_id), v_qualified, format('changefeed_feed_%s', v_id));
    end if;

    perform changefeed.generate_feed(v_id);
    return v_id;
end
$$;
