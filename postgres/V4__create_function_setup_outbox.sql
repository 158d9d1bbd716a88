-- Creates or completes a claim-style outbox table:
--   select changefeed.setup_outbox('public.outbox');
-- Call it from your own migrations (any tool that runs SQL). A missing table is created
-- whole; for an existing one (a partial install, a table made by hand) missing indexes and
-- triggers are added and missing columns are reported (SQLSTATE CF306, the number 51306 of
-- the other bundles), since adding them to a table with rows is the owner's decision.
-- Nothing is ever dropped. Safe to run again. The name is checked by
-- changefeed.check_outbox_name (CF000) before any dynamic SQL; every name that reaches it
-- goes through format's %I (identifiers) or %L (literals).
--
-- status: 0 pending, 1 processing, 2 done, 3 failed (due again at next_retry_at), 4 dead.
-- attempts counts failures: mark_failed and expired claims, never a plain claim.
-- Times are timestamptz from the server's clock (now()), never the client's.
-- payload and headers are json, not jsonb: the text is kept as enqueued (key order,
-- duplicate keys, number spelling), so a relay publishes exactly what was written.
-- Text compares exactly in PostgreSQL whatever the collation (no padding, no case folding),
-- so 'ABC' and 'abc' are two aggregates and two message ids, as on the other stores.
create function changefeed.setup_outbox(p_outbox text)
returns void
language plpgsql
set search_path = pg_catalog, pg_temp
-- Without it every call after the first prints "already exists, skipping" notices.
set client_min_messages = warning
as $$
declare
    v_parts constant text[] := changefeed.check_outbox_name(p_outbox);
    v_schema constant text := v_parts[1];
    v_table constant text := v_parts[2];
    v_qualified constant text := format('%I.%I', v_parts[1], v_parts[2]);
    v_missing text;
    v_sequence text;
begin
    if not exists (select 1 from pg_namespace where nspname = v_schema) then
        raise exception using
            errcode = 'CF000',
            message = format('changefeed.setup_outbox: the schema %I does not exist', v_schema),
            hint = format('Create it first (create schema %I), or name another.', v_schema);
    end if;

    execute format(
        'create table if not exists %s ('
        'id bigserial primary key, '
        'message_id varchar(64) not null check (message_id <> %L), '
        'topic varchar(256) not null check (topic <> %L), '
        'aggregate_type varchar(128) null, '
        'aggregate_id varchar(256) null, '
        'partition_key varchar(256) null, '
        'payload json not null, '
        'headers json null, '
        'trace_id varchar(128) null, '
        'status smallint not null default 0 check (status between 0 and 4), '
        'attempts integer not null default 0, '
        'claimed_at timestamptz null, '
        'claim_expires_at timestamptz null, '
        'claim_token uuid null, '
        'next_retry_at timestamptz null, '
        'created_at timestamptz not null default now(), '
        'processed_at timestamptz null, '
        'last_error varchar(2000) null'
        ')',
        v_qualified, '', ''
    );

    -- Each claim stores its own expiry (now + the claiming relay's timeout), so a row expires
    -- by the timeout of the relay that holds it, not by that of whichever relay looks next.
    -- An outbox made before the column existed gets it here: nullable, nothing rewritten.
    execute format('alter table %s add column if not exists claim_expires_at timestamptz null',
        v_qualified);

    select string_agg(required.name, ', ' order by required.position)
    into v_missing
    from unnest(array[
        'id', 'message_id', 'topic', 'aggregate_type', 'aggregate_id', 'partition_key',
        'payload', 'headers', 'trace_id', 'status', 'attempts', 'claimed_at', 'claim_token',
        'next_retry_at', 'created_at', 'processed_at', 'last_error'
    ]) with ordinality as required(name, position)
    where not exists (
        select 1
        from pg_attribute as a
        where a.attrelid = v_qualified::regclass
            and a.attname = required.name
            and a.attnum > 0
            and not a.attisdropped
    );
    if v_missing is not null then
        raise exception using
            errcode = 'CF306',
            message = format(
                'changefeed.setup_outbox: the existing table %s lacks the columns %s',
                v_qualified, v_missing
            ),
            hint = 'Add them (see README.md, "The claim outbox on PostgreSQL") or drop the '
                || 'table if it holds nothing, then call changefeed.setup_outbox again.';
    end if;

    v_sequence := pg_get_serial_sequence(v_qualified, 'id');
    if v_sequence is null then
        raise exception using
            errcode = 'CF306',
            message = format(
                'changefeed.setup_outbox: the id column of %s takes its values from no '
                'sequence', v_qualified
            ),
            hint = 'Make id a bigserial (or an identity column), as setup_outbox creates it.';
    end if;

    -- The ordering trigger's argument needs ids that increase in the order they are drawn;
    -- a sequence that caches values per session hands a later draw a lower number.
    if (select s.seqcache from pg_sequence as s where s.seqrelid = v_sequence::regclass) <> 1
    then
        raise exception using
            errcode = 'CF306',
            message = format(
                'changefeed.setup_outbox: the sequence %s of %s caches values per session',
                v_sequence, v_qualified
            ),
            hint = format(
                'Per-aggregate order needs ids in the order they are drawn: alter sequence %s '
                || 'cache 1.', v_sequence
            );
    end if;

    -- Each index for a query of the store:
    --   <table>_message_id  enqueue's idempotency (a key already there returns its row);
    --   <table>_open        the claim's scan, in id order, over open rows only;
    --   <table>_head        the claim's probe for an earlier open row of the aggregate;
    --   <table>_done        purge_done's walk over old done rows.
    execute format(
        'create unique index if not exists %I on %s (message_id)',
        v_table || '_message_id', v_qualified
    );
    execute format(
        'create index if not exists %I on %s (id) where status in (0, 1, 3)',
        v_table || '_open', v_qualified
    );
    execute format(
        'create index if not exists %I on %s (aggregate_id, id) where status in (0, 1, 3)',
        v_table || '_head', v_qualified
    );
    execute format(
        'create index if not exists %I on %s (processed_at) where status = 2',
        v_table || '_done', v_qualified
    );

    -- The two triggers (V2, V3), added when missing. Their arguments are fixed here, once:
    -- the id sequence and the channel 'changefeed:<schema>.<table>' (at most 63 bytes by
    -- the name rule, PostgreSQL's limit for a channel name).
    if not exists (
        select 1 from pg_trigger
        where tgrelid = v_qualified::regclass and tgname = 'changefeed_order'
    ) then
        execute format(
            'create trigger changefeed_order before insert on %s for each row '
            'execute function changefeed.order_aggregate(%L)',
            v_qualified, v_sequence
        );
    end if;
    if not exists (
        select 1 from pg_trigger
        where tgrelid = v_qualified::regclass and tgname = 'changefeed_notify'
    ) then
        execute format(
            'create trigger changefeed_notify after insert on %s for each statement '
            'execute function changefeed.notify(%L)',
            v_qualified, 'changefeed:' || p_outbox
        );
    end if;
end
$$;
