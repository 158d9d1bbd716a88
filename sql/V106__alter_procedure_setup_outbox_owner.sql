-- Creates a claim-style outbox: exec changefeed.setup_outbox @table_name = N'dbo.outbox'.
-- The table (or the missing parts of an existing one: indexes, constraints), its registry
-- row, its procedures [changefeed].[<kind>:schema.table] (changefeed.outbox_objects) and
-- its roles [changefeed.relay:schema.table] and [changefeed.enqueue:schema.table]
-- (upgrade_outbox, through grant_outbox_roles), in one transaction. Re-running it repairs a
-- partial install and regenerates the procedures; it never drops data.
-- (Replaces V36's.) What changed: a table outside the ownership chain of changefeed's
-- procedures is refused (51013) before anything is created, as setup_feed refuses one:
-- the table an existing one, or the one it would create in a schema whose owner is not the
-- changefeed schema's owner. Every call of a login that has only the outbox's roles would
-- fail with Msg 229 there, and granting those roles rights on the table would give them the
-- whole table. The message names the statement that fixes it and what that statement
-- removes (changefeed.owner_chain_problem).
create or alter procedure [changefeed].[setup_outbox]
    @table_name nvarchar(4000) = N'dbo.outbox',
    @native_json bit = 0
as
begin
    set nocount, xact_abort on;
    -- It begins and commits its own transaction: under a caller's SET IMPLICIT_TRANSACTIONS
    -- ON that commit would leave a level open with every lock held. Reverts on return.
    set implicit_transactions off;
    -- create_outbox_storage runs ALTER TABLE and CREATE INDEX in this transaction, which SQL
    -- Server refuses at SNAPSHOT isolation after BEGIN TRANSACTION (error 3961). Reverts on
    -- return.
    set transaction isolation level read committed;

    declare @schema_name sysname;
    declare @object_name sysname;
    declare @message nvarchar(2048);
    declare @object_id int;
    declare @qualified_name nvarchar(300);

    exec changefeed.check_table_name
        @table_name = @table_name,
        @schema_name = @schema_name output,
        @object_name = @object_name output;
    if schema_id(@schema_name) is null
    begin
        set @message = N'setup_outbox: the schema ''' + @schema_name
            + N''' does not exist. Create it first (create schema ...).';
        throw 51001, @message, 1;
    end;
    if exists (
        select 1 from changefeed.feeds
        where schema_name = @schema_name and table_name = @object_name
    )
    begin
        set @message = N'setup_outbox: ''' + @table_name
            + N''' is an event table with a feed. A claim outbox needs a table of its own.';
        throw 51005, @message, 1;
    end;
    exec changefeed.check_owner_chain
        @schema_name = @schema_name,
        @table_name = @object_name,
        @caller = N'setup_outbox';

    begin try
        begin transaction;
        exec changefeed.lock_generators;

        exec changefeed.create_outbox_storage
            @schema_name = @schema_name,
            @table_name = @object_name,
            @native_json = @native_json;

        set @object_id = object_id(quotename(@schema_name) + N'.' + quotename(@object_name), N'U');
        -- The catalog's spelling, so per-outbox names match the table's.
        set @schema_name = object_schema_name(@object_id);
        set @object_name = object_name(@object_id);
        set @qualified_name = @schema_name + N'.' + @object_name;

        -- By name: a table dropped and created again has a new object id but is the same
        -- outbox, and its registry row follows it.
        update changefeed.outboxes with (updlock, holdlock)
        set
            object_id = @object_id,
            native_json = isnull(@native_json, 0)
        where schema_name = @schema_name and table_name = @object_name;

        if @@rowcount = 0
            insert into changefeed.outboxes
            (object_id, schema_name, table_name, native_json, generator_version)
            values (
                @object_id, @schema_name, @object_name, isnull(@native_json, 0),
                changefeed.generator_version()
            );

        exec changefeed.upgrade_outbox @table_name = @qualified_name;

        commit transaction;
    end try
    begin catch
        if @@trancount > 0 rollback transaction;
        throw;
    end catch;
end
