-- The index open_heads (is_open, aggregate_id, id) on every outbox: the open messages grouped
-- by aggregate, each aggregate's head (its lowest open id) first. With it a claim finds the
-- heads past a deep backlog of a few aggregates one index descent per aggregate with open
-- messages, instead of reading every open message behind heads it cannot take (a message
-- in flight or waiting for its retry): MariaDB has no partial index, and head_of_aggregate
-- (aggregate_id, is_open, id) also holds every done message kept until the purge.
-- changefeed_setup_outbox adds it to an existing outbox: call it again for each outbox after
-- this migration. InnoDB builds the index online (writers go on meanwhile), but the ALTER
-- waits for the table's metadata lock at its start and its end, behind any transaction that
-- has touched the table: run it when no long transaction is open on the outbox. Until then
-- the claim reads as it did before (MysqlOutboxStore looks for the index).
drop procedure if exists changefeed_add_index;

-- Adds an index to an outbox table unless one of that name is already there (a repair after
-- a partial install or a hand-made table). Internal: changefeed_setup_outbox calls it with
-- constant kinds and column lists, and accepts only those. The table name is checked again
-- here because the procedure can be called on its own and builds DDL from it.
create procedure changefeed_add_index(
    in p_table_name varchar(255),
    in p_index_name varchar(64),
    in p_kind varchar(16),
    in p_columns varchar(255)
)
    modifies sql data
    sql security invoker
begin
    call changefeed_check_table_name(p_table_name);
    -- Only the five indexes setup_outbox adds, so that no caller-made text reaches DDL.
    if (p_index_name, p_kind, p_columns) not in (
        ('message_id_unique', 'unique', 'message_id'),
        ('open_messages', '', 'is_open, id'),
        ('head_of_aggregate', '', 'aggregate_id, is_open, id'),
        ('open_heads', '', 'is_open, aggregate_id, id'),
        ('done_by_processed_at', '', 'status, processed_at')
    ) then
        signal sqlstate '45000' set mysql_errno = 51009,
            message_text = 'changefeed_add_index: not one of the outbox indexes (internal).';
    end if;

    if not exists (
        select 1
        from information_schema.statistics
        where table_schema = database()
            and table_name = p_table_name
            and index_name = p_index_name
    ) then
        set @changefeed_ddl = concat(
            'alter table `', p_table_name, '` add ', p_kind, ' index `', p_index_name,
            '` (', p_columns, ')'
        );
        prepare changefeed_statement from @changefeed_ddl;
        execute changefeed_statement;
        deallocate prepare changefeed_statement;
    end if;
end;

drop procedure if exists changefeed_setup_outbox;

-- Creates or completes a claim-style outbox table in the current database:
--   CALL changefeed_setup_outbox('outbox');
-- Call it from your own migrations (any tool that runs SQL). A missing table is created
-- whole; for an existing one (a partial install, a table made by hand, an outbox made
-- before V4 or V5) missing indexes and the column claim_expires_at are added, and other
-- missing columns are reported, since adding them to a table with rows is the owner's
-- decision.
-- Nothing is ever dropped. Safe to run again.
--
-- The name is checked by changefeed_check_table_name (error 51000) before any dynamic SQL.
--
-- status: 0 pending, 1 processing, 2 done, 3 failed (due again at next_retry_at), 4 dead.
-- attempts counts failures: mark_failed and expired claims, never a plain claim.
-- claim_expires_at: when a processing row's claim ends (claimed_at + the claimer's timeout).
-- Times are DATETIME(3) in UTC from the server's clock (UTC_TIMESTAMP), never the client's.
create procedure changefeed_setup_outbox(in p_table_name varchar(255))
    modifies sql data
    sql security invoker
begin
    declare v_missing text default null;
    declare v_message varchar(512);

    call changefeed_check_table_name(p_table_name);

    -- utf8mb4_bin: keys and aggregate ids compare exactly ('ABC' and 'abc' are two
    -- aggregates; trailing spaces count), and every Unicode character fits.
    -- is_open is generated from status so that one index, (is_open, id), hands the claim its
    -- candidates in id order: the claim's ORDER BY id LIMIT is then read straight off the
    -- index. A filesort instead would read, and under FOR UPDATE lock, every candidate row.
    -- JSON: MySQL's native type; on MariaDB an alias of LONGTEXT with a JSON_VALID check.
    set @changefeed_ddl = concat(
        'create table if not exists `', p_table_name, '` (',
        'id bigint not null auto_increment, ',
        'message_id varchar(64) not null, ',
        'topic varchar(256) not null, ',
        'aggregate_type varchar(128) null, ',
        'aggregate_id varchar(256) null, ',
        'partition_key varchar(256) null, ',
        'payload json not null, ',
        'headers json null, ',
        'trace_id varchar(128) null, ',
        'status tinyint not null default 0 check (status between 0 and 4), ',
        'attempts int not null default 0, ',
        'claimed_at datetime(3) null, ',
        'claim_token binary(16) null, ',
        'next_retry_at datetime(3) null, ',
        'created_at datetime(3) not null, ',
        'processed_at datetime(3) null, ',
        'last_error varchar(2000) null, ',
        'is_open tinyint as (status in (0, 1, 3)) stored, ',
        'claim_expires_at datetime(3) null, ',
        'primary key (id)',
        ') engine = InnoDB default charset = utf8mb4 collate = utf8mb4_bin'
    );
    prepare changefeed_statement from @changefeed_ddl;
    execute changefeed_statement;
    deallocate prepare changefeed_statement;

    select group_concat(required.name order by required.position separator ', ')
    into v_missing
    from (
        select 1 as position, 'id' as name union all select 2, 'message_id'
        union all select 3, 'topic' union all select 4, 'aggregate_type'
        union all select 5, 'aggregate_id' union all select 6, 'partition_key'
        union all select 7, 'payload' union all select 8, 'headers'
        union all select 9, 'trace_id' union all select 10, 'status'
        union all select 11, 'attempts' union all select 12, 'claimed_at'
        union all select 13, 'claim_token' union all select 14, 'next_retry_at'
        union all select 15, 'created_at' union all select 16, 'processed_at'
        union all select 17, 'last_error' union all select 18, 'is_open'
    ) as required
    where not exists (
        select 1
        from information_schema.columns as c
        where c.table_schema = database()
            and c.table_name = p_table_name
            and c.column_name = required.name
    );
    if v_missing is not null then
        set v_message = concat(
            'changefeed_setup_outbox: the existing table `', p_table_name,
            '` lacks the columns ', v_missing, '. Add them (see README.md, "The claim',
            ' outbox on MariaDB and MySQL") or drop the table if it holds nothing, then',
            ' call changefeed_setup_outbox again.'
        );
        signal sqlstate '45000' set mysql_errno = 51306, message_text = v_message;
    end if;

    -- An outbox made before V4: the claim's expiry, null on rows claimed before (the
    -- claim then falls back to claimed_at and the claiming relay's timeout).
    if not exists (
        select 1
        from information_schema.columns as c
        where c.table_schema = database()
            and c.table_name = p_table_name
            and c.column_name = 'claim_expires_at'
    ) then
        set @changefeed_ddl = concat(
            'alter table `', p_table_name, '` add column claim_expires_at datetime(3) null'
        );
        prepare changefeed_statement from @changefeed_ddl;
        execute changefeed_statement;
        deallocate prepare changefeed_statement;
    end if;

    -- Each index for a query of the store:
    --   message_id_unique     enqueue's idempotency (a key already there returns its row);
    --   open_messages         the claim's scan, in id order, over open rows only;
    --   head_of_aggregate     the claim's probe for an earlier open row of the aggregate;
    --   open_heads            the claim's walk over the heads of aggregates with open rows;
    --   done_by_processed_at  purge_done's walk over old done rows.
    call changefeed_add_index(p_table_name, 'message_id_unique', 'unique', 'message_id');
    call changefeed_add_index(p_table_name, 'open_messages', '', 'is_open, id');
    call changefeed_add_index(
        p_table_name, 'head_of_aggregate', '', 'aggregate_id, is_open, id'
    );
    call changefeed_add_index(
        p_table_name, 'open_heads', '', 'is_open, aggregate_id, id'
    );
    call changefeed_add_index(
        p_table_name, 'done_by_processed_at', '', 'status, processed_at'
    );
end
