-- Creates or repairs a claim-style outbox table (ARCHITECTURE.md, "The claim protocol"). Every part is guarded: a
-- missing table is created whole; for an existing one (a partial install, a table created
-- by hand) missing indexes and constraints are added, and missing columns are reported,
-- since adding them to a table with rows is the owner's decision. Nothing is ever dropped.
-- Internal: setup_outbox calls it after checking the name; the template outbox is built with
-- it too (V62 runs it on the template outbox for claim_expires_at), and upgrade_outbox (V88)
-- on a registered outbox that lacks a column the template has.
--
-- Replaces the first version, for the claim's own expiry (issue 18): claim_expires_at is
-- when the claim of a processing row runs out, as the claiming relay's timeout set it, so
-- each claim expires by the timeout its holder chose (the reaper used to apply the
-- re-claiming relay's timeout to every claim: a relay with a shorter one took rows another
-- still held). It is the one column added here to an existing table rather than reported:
-- nullable without a default, so adding it changes metadata only, whatever the table holds,
-- and NULL means "claimed before the column existed" (claim then falls back to the
-- re-claiming relay's timeout, as before). open_messages includes it, so the claim scan
-- reads it without visiting the table; an existing open_messages without it is re-created
-- (drop_existing): that index holds only open rows (pending, processing, failed), so this
-- costs what those rows cost, under a schema lock on the table for that time.
--
-- Lock waits are bounded (the session's LOCK_TIMEOUT when it is shorter, else 60 s; then
-- 51012: transient, retry), see the first statements.
--
-- status: 0 pending, 1 processing, 2 done, 3 failed (due again at next_retry_at), 4 dead.
-- attempts counts failures: mark_failed and expired claims, never a plain claim.
-- Row store with a clustered bigint identity, never columnstore: claims are point updates.
--
-- Queue access, row by row (every statement that claims, acknowledges or probes skips or
-- locks single rows, with READPAST where it must not wait):
--   allow_page_locks = off on every index. READPAST skips locked rows only; a page lock
--     (which the engine may choose for a scan of any index that allows them) would make a
--     claimer skip a whole page of due messages, or make a READPAST reader wait behind it.
--     Trade-off: ALTER INDEX ... REORGANIZE needs page locks; maintain these indexes with
--     REBUILD instead.
--   lock_escalation = disable. An escalated table lock (a large purge, a big enqueue batch)
--     is not skipped by READPAST: every claimer and every writer would wait for it.
-- Collations: message_id, aggregate_id and partition_key are keys compared by their exact
-- text (a message id, an ordering group, a broker's routing key), so all three are
-- Latin1_General_100_BIN2: 'ABC' and 'abc' are two keys under any database collation, and
-- an expression that mixes two of them has one collation. An existing table keeps the
-- collations it has (changing a collation is the owner's decision, as adding a column is):
-- the generated code says the collation explicitly wherever two of these columns meet and
-- never compares partition_key, so it runs with any collation of it.
create or alter procedure [changefeed].[create_outbox_storage]
    @schema_name sysname,
    @table_name sysname,
    @native_json bit = 0
as
begin
    set nocount, xact_abort on;
    -- It begins and commits its own transaction: under a caller's SET IMPLICIT_TRANSACTIONS
    -- ON that commit would leave a second level open with every lock held. Reverts on return.
    set implicit_transactions off;
    -- Every statement below that changes an existing table (an added column, index or
    -- constraint) needs a schema-modification lock on it, which waits for every
    -- transaction that uses the table: an open enqueue of a business transaction, a claim,
    -- a long query. Bounded, as the generators lock is (60 s, then 51012 below), so that
    -- setup_outbox and upgrade_outbox never wait without end. A caller's shorter bound is
    -- kept: upgrade_all_feeds runs with 2 s, and while this waits for the schema lock every
    -- enqueue, claim and acknowledgement of the table queues behind it, so the shorter the
    -- wait, the shorter theirs. Reverts on return.
    if @@lock_timeout < 0 or @@lock_timeout > 60000
        set lock_timeout 60000;
    declare @lock_timeout_ms int = @@lock_timeout;

    declare @table nvarchar(300) = quotename(@schema_name) + N'.' + quotename(@table_name);
    declare @json_type nvarchar(20) = case
        when isnull(@native_json, 0) = 1 then N'json' else N'nvarchar(max)'
    end;
    declare @object_id int;
    declare @missing nvarchar(max);
    declare @message nvarchar(2048);
    declare @sql nvarchar(max);

    if isnull(@native_json, 0) = 1 and type_id(N'json') is null
        throw 51307, N'setup_outbox: @native_json = 1 needs the json data type (Azure SQL Database, Azure SQL Managed Instance, SQL Server 2025). Use @native_json = 0 here: payloads are then nvarchar(max) checked with ISJSON.', 1;

    begin try
        begin transaction;

        if object_id(@table, N'U') is null
        begin
            -- Constraint names are schema-scoped, so they carry the table's name.
            set @sql = N'create table ' + @table + N' ('
                + N'id bigint identity (1, 1) not null, '
                -- Binary collation: keys and aggregate ids compare exactly, so 'ABC' and
                -- 'abc' are two messages and two aggregates under any database collation.
                + N'message_id nvarchar(64) collate Latin1_General_100_BIN2 not null'
                + N' default (convert(nvarchar(64), newid())), '
                + N'topic nvarchar(256) not null, '
                + N'aggregate_type nvarchar(128) null, '
                + N'aggregate_id nvarchar(256) collate Latin1_General_100_BIN2 null, '
                + N'partition_key nvarchar(256) collate Latin1_General_100_BIN2 null, '
                + N'payload ' + @json_type + N' not null, '
                + N'headers ' + @json_type + N' null, '
                + N'trace_id nvarchar(128) null, '
                + N'status tinyint not null default 0, '
                + N'attempts int not null default 0, '
                + N'claimed_at datetime2(3) null, '
                + N'claim_token uniqueidentifier null, '
                + N'claim_expires_at datetime2(3) null, '
                + N'next_retry_at datetime2(3) null, '
                + N'created_at datetime2(3) not null default sysutcdatetime(), '
                + N'processed_at datetime2(3) null, '
                + N'last_error nvarchar(2000) null, '
                + N'constraint ' + quotename(@table_name + N':pk')
                + N' primary key clustered (id) with (allow_page_locks = off));';
            exec sys.sp_executesql @sql;
        end;

        set @object_id = object_id(@table, N'U');

        select @missing = string_agg(convert(nvarchar(max), required.name), N', ')
        from (
            values
            (N'id'), (N'message_id'), (N'topic'), (N'aggregate_type'), (N'aggregate_id'),
            (N'partition_key'), (N'payload'), (N'headers'), (N'trace_id'), (N'status'),
            (N'attempts'), (N'claimed_at'), (N'claim_token'), (N'next_retry_at'),
            (N'created_at'), (N'processed_at'), (N'last_error')
        ) as required (name)
        where not exists (
            select 1
            from sys.columns as c
            where c.object_id = @object_id and c.name = required.name
        );
        if @missing is not null
        begin
            set @message = N'setup_outbox: the existing table ' + @table
                + N' lacks the columns ' + @missing + N'. Add them (see README.md, claim'
                + N' outbox) or drop the table if it holds nothing, then run setup_outbox again.';
            throw 51306, @message, 1;
        end;

        if col_length(@table, N'claim_expires_at') is null
        begin
            set @sql = N'alter table ' + @table + N' add claim_expires_at datetime2(3) null;';
            exec sys.sp_executesql @sql;
        end;

        if not exists (
            select 1 from sys.indexes
            where object_id = @object_id and name = N'message_id_unique'
        )
        begin
            set @sql = N'create unique index message_id_unique on ' + @table
                + N' (message_id) with (allow_page_locks = off);';
            exec sys.sp_executesql @sql;
        end;
        -- The head probes of claim: the earlier rows of an aggregate, read twice (see claim).
        if not exists (
            select 1 from sys.indexes
            where object_id = @object_id and name = N'head_of_aggregate'
        )
        begin
            set @sql = N'create index head_of_aggregate on ' + @table
                + N' (aggregate_id, id) include (status) with (allow_page_locks = off);';
            exec sys.sp_executesql @sql;
        end;
        -- The claim scan touches open rows only, however many done rows accumulate. An
        -- open_messages from before claim_expires_at is re-created with it (see the top).
        if not exists (
            select 1
            from sys.indexes as i
            inner join sys.index_columns as ic
                on ic.object_id = i.object_id and ic.index_id = i.index_id
            inner join sys.columns as c
                on c.object_id = ic.object_id and c.column_id = ic.column_id
            where
                i.object_id = @object_id and i.name = N'open_messages'
                and c.name = N'claim_expires_at'
        )
        begin
            set @sql = N'create index open_messages on ' + @table
                + N' (id) include (status, next_retry_at, claimed_at, claim_expires_at,'
                + N' aggregate_id) where status in (0, 1, 3) with (allow_page_locks = off'
                + case
                    when exists (
                        select 1 from sys.indexes
                        where object_id = @object_id and name = N'open_messages'
                    )
                        then N', drop_existing = on'
                    else N''
                end
                + N');';
            exec sys.sp_executesql @sql;
        end;
        -- Retention: purge_done walks done rows by age.
        if not exists (
            select 1 from sys.indexes
            where object_id = @object_id and name = N'done_by_processed_at'
        )
        begin
            set @sql = N'create index done_by_processed_at on ' + @table
                + N' (status, processed_at) with (allow_page_locks = off);';
            exec sys.sp_executesql @sql;
        end;

        if object_id(quotename(@schema_name) + N'.' + quotename(@table_name + N':status_ck'), N'C') is null
        begin
            set @sql = N'alter table ' + @table + N' add constraint '
                + quotename(@table_name + N':status_ck') + N' check (status between 0 and 4);';
            exec sys.sp_executesql @sql;
        end;
        if isnull(@native_json, 0) = 0
            and object_id(quotename(@schema_name) + N'.' + quotename(@table_name + N':json_ck'), N'C') is null
        begin
            set @sql = N'alter table ' + @table + N' add constraint '
                + quotename(@table_name + N':json_ck')
                + N' check (isjson(payload) = 1 and (headers is null or isjson(headers) = 1));';
            exec sys.sp_executesql @sql;
        end;

        -- An existing table (created by hand, or before these options) gets them too. Both
        -- are metadata changes that may run inside this transaction. ALL: any index of the
        -- table is maintained by the claims' and acknowledgements' row updates, a user's
        -- extra index too.
        if exists (
            select 1 from sys.indexes
            where object_id = @object_id and index_id > 0 and allow_page_locks = 1
        )
        begin
            set @sql = N'alter index all on ' + @table + N' set (allow_page_locks = off);';
            exec sys.sp_executesql @sql;
        end;
        if exists (
            select 1 from sys.tables
            where object_id = @object_id and lock_escalation_desc <> N'DISABLE'
        )
        begin
            set @sql = N'alter table ' + @table + N' set (lock_escalation = disable);';
            exec sys.sp_executesql @sql;
        end;

        commit transaction;
    end try
    begin catch
        -- 1222: a lock wait ran out (see the top).
        if error_number() = 1222
        begin
            if @@trancount > 0 rollback transaction;
            set @message = N'Changing the claim outbox table ' + @table
                + N' waited over ' + convert(nvarchar(11), @lock_timeout_ms)
                + N' ms for a lock that another transaction holds on it (an open enqueue, a'
                + N' claim, a long query). Retry when that transaction has ended.';
            throw 51012, @message, 1;
        end;
        if @@trancount > 0 rollback transaction;
        throw;
    end catch;
end
