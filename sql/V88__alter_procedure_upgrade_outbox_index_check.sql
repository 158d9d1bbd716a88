-- Regenerates the procedures of one claim-style outbox from the current templates
-- (the template outbox's procedures, copied by changefeed.copy_template). The table's rows
-- are untouched.
-- (Replaces V35's.) What changed:
--   * an outbox that changefeed.outbox_problem finds broken (a column its procedures name
--     missing, or an index they name in hints missing or reshaped) is refused (51016) before
--     anything is regenerated, with the statement that fixes it: its code would fail to be
--     created (Msg 207) or fail on every call (Msg 308), or scan and wait where it must
--     seek, and a regeneration that failed here would doom the caller's transaction under
--     XACT_ABORT. A table that does not exist is refused too (51016, with the text
--     upgrade_all_feeds records for it, which skips such an outbox): regenerated, it would
--     get code for no table and lose the problem the registry records;
--   * what the code needs and the table may lack, the upgrade adds: claim_expires_at, which
--     the migration that introduced it gave only the outboxes it did not skip as broken. An
--     outbox repaired since is given it here by create_outbox_storage, as that migration
--     gave it every other one (the column, nullable without a default: metadata only; and
--     open_messages re-created to include it). create_outbox_storage bounds its lock waits
--     (the session's LOCK_TIMEOUT when shorter, as upgrade_all_feeds' 2 s, else 60 s; then
--     51012), so an upgrade never waits without end for a transaction that holds the table.
--     It runs before any procedure is regenerated, so it never waits while this transaction
--     holds the outbox's altered procedures;
--   * a registered outbox is found by the registry's spelling of its name and regenerated
--     under it, without changefeed.check_table_name: the names were checked when the outbox
--     was set up, and the rule has since changed only how a length is counted. Since V71
--     parse_feed_name counts UTF-16 code units, and an outbox set up before it under a
--     supplementary-character (_SC) collation may have a name of up to 111 units (len()
--     counted an emoji once). 111 is the outboxes' own limit: the longest name generated for
--     one, '[changefeed].[held_aggregates:<schema>.<table>]', has 16 + 1 units around the
--     two names and fits in 128. (Feeds keep 108: their role names are longer.) Refusing
--     it would fail every regenerating migration. A name that is not registered is checked
--     as before (51000), then refused as not an outbox (51006);
--   * a successful regeneration clears the outbox's recorded problem;
--   * it creates the outbox's roles and grants them their procedures (grant_outbox_roles).
create or alter procedure [changefeed].[upgrade_outbox]
    @table_name nvarchar(4000)
as
begin
    set nocount, xact_abort on;
    -- It begins and commits its own transaction: under a caller's SET IMPLICIT_TRANSACTIONS
    -- ON that commit would leave a level open with every lock held. Reverts on return.
    set implicit_transactions off;
    -- create_outbox_storage (an outbox without claim_expires_at) runs ALTER TABLE and CREATE
    -- INDEX in this transaction, which SQL Server refuses at SNAPSHOT isolation after BEGIN
    -- TRANSACTION (error 3961), as setup_outbox says. Reverts on return.
    set transaction isolation level read committed;

    declare @schema_name sysname;
    declare @object_name sysname;
    declare @outbox_id int;
    declare @template nvarchar(300);
    declare @message nvarchar(2048);
    declare @native_json bit;
    declare @table_id int;
    declare @problem nvarchar(1000);

    -- parsename takes a sysname: a longer argument would be cut, so it is not looked up.
    -- Each part is compared with the registry's column (its collation decides, as for
    -- every other lookup of the registry).
    select
        @outbox_id = o.outbox_id,
        @schema_name = o.schema_name,
        @object_name = o.table_name,
        @native_json = o.native_json
    from changefeed.outboxes as o
    where
        datalength(@table_name) / 2 <= 128
        and parsename(@table_name, 3) is null
        and o.schema_name = parsename(@table_name, 2)
        and o.table_name = parsename(@table_name, 1);
    if @outbox_id is null
    begin
        -- A name the rules refuse gets their message (51000).
        exec changefeed.check_table_name
            @table_name = @table_name,
            @schema_name = @schema_name output,
            @object_name = @object_name output;
        set @message = N'''' + @table_name
            + N''' is not a claim outbox. Set it up first: exec changefeed.setup_outbox'
            + N' @table_name = N''' + replace(@table_name, N'''', N'''''') + N'''.';
        throw 51006, @message, 1;
    end;

    set @table_id = object_id(quotename(@schema_name) + N'.' + quotename(@object_name), N'U');
    if @table_id is null
    begin
        set @message = N'The claim outbox table ''' + @schema_name + N'.' + @object_name
            + N''' was dropped or renamed. Create it again (or rename it back):'
            + N' exec changefeed.setup_outbox @table_name = N'''
            + replace(@schema_name + N'.' + @object_name, N'''', N'''''') + N''''
            -- The outbox's storage kind, or setup_outbox would register it as nvarchar JSON.
            + case when @native_json = 1 then N', @native_json = 1' else N'' end + N';';
        throw 51016, @message, 1;
    end
    else
    begin
        select @problem = problem
        from changefeed.outbox_problem(@table_id, @schema_name, @object_name, @native_json);
        if @problem is not null
            throw 51016, @problem, 1;
    end;

    begin try
        begin transaction;
        exec changefeed.lock_generators;

        -- A column of the template outbox the table lacks is one outbox_problem leaves to
        -- the upgrade (claim_expires_at, see the top): create_outbox_storage adds it.
        if exists (
            select 1
            from sys.columns as t
            where
                t.object_id = object_id(N'[changefeed].[__template_outbox__]', N'U')
                and not exists (
                    select 1
                    from sys.columns as c
                    where c.object_id = @table_id and c.name = t.name
                )
        )
            exec changefeed.create_outbox_storage
                @schema_name = @schema_name,
                @table_name = @object_name,
                @native_json = @native_json;

        declare templates cursor local fast_forward for
        select t.quoted_name
        from changefeed.outbox_objects(N'changefeed', N'__template_outbox__') as t
        order by t.kind;

        open templates;
        fetch next from templates into @template;
        while @@fetch_status = 0
        begin
            exec changefeed.copy_template
                @template = @template,
                @template_table = N'__template_outbox__',
                @schema_name = @schema_name,
                @table_name = @object_name;
            fetch next from templates into @template;
        end;
        close templates;
        deallocate templates;

        -- The outbox's roles and their grants (V105). In a database migrated only part of
        -- the way (below V105), setup_outbox runs this before that procedure exists; the
        -- upgrade after the migrations that generator version 6 (V107) calls for then
        -- reaches every outbox again.
        if object_id(N'[changefeed].[grant_outbox_roles]', N'P') is not null
            exec changefeed.grant_outbox_roles
                @schema_name = @schema_name,
                @table_name = @object_name;

        update changefeed.outboxes
        set
            generator_version = changefeed.generator_version(),
            upgraded_at = sysutcdatetime(),
            problem = null
        where outbox_id = @outbox_id;

        commit transaction;
    end try
    begin catch
        if @@trancount > 0 rollback transaction;
        throw;
    end catch;
end
