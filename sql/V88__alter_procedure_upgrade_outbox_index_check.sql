-- Regenerates the procedures of one claim-style outbox from the current templates
-- (the template outbox's procedures, copied by changefeed.copy_template). The table and its rows are untouched.
-- (Replaces V35's.) What changed: an outbox whose indexes are not what the generated code
-- names in its hints (changefeed.outbox_index_problem: the clustered index on (id) that
-- the claim's update and the acknowledgements seek, head_of_aggregate that the claim's
-- probe reads) is refused (51016) before anything is regenerated, with the statement that
-- fixes it: its code would fail on every call (Msg 308), or scan and wait where it must
-- seek, and a regeneration that
-- failed here would doom the caller's transaction under XACT_ABORT. A table that does not
-- exist is not checked here (upgrade_all_feeds reports it).
create or alter procedure [changefeed].[upgrade_outbox]
    @table_name nvarchar(4000)
as
begin
    set nocount, xact_abort on;
    -- It begins and commits its own transaction: under a caller's SET IMPLICIT_TRANSACTIONS
    -- ON that commit would leave a level open with every lock held. Reverts on return.
    set implicit_transactions off;

    declare @schema_name sysname;
    declare @object_name sysname;
    declare @outbox_id int;
    declare @template nvarchar(300);
    declare @message nvarchar(2048);
    declare @native_json bit;
    declare @table_id int;
    declare @index_problem nvarchar(1000);

    exec changefeed.check_table_name
        @table_name = @table_name,
        @schema_name = @schema_name output,
        @object_name = @object_name output;

    select
        @outbox_id = outbox_id,
        @native_json = native_json
    from changefeed.outboxes
    where schema_name = @schema_name and table_name = @object_name;
    if @outbox_id is null
    begin
        set @message = N'''' + @table_name
            + N''' is not a claim outbox. Set it up first: exec changefeed.setup_outbox'
            + N' @table_name = N''' + @table_name + N'''.';
        throw 51006, @message, 1;
    end;

    set @table_id = object_id(quotename(@schema_name) + N'.' + quotename(@object_name), N'U');
    if @table_id is not null
    begin
        select @index_problem = problem
        from changefeed.outbox_index_problem(@table_id, @schema_name, @object_name, @native_json);
        if @index_problem is not null
            throw 51016, @index_problem, 1;
    end;

    begin try
        begin transaction;
        exec changefeed.lock_generators;

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

        update changefeed.outboxes
        set
            generator_version = changefeed.generator_version(),
            upgraded_at = sysutcdatetime()
        where outbox_id = @outbox_id;

        commit transaction;
    end try
    begin catch
        if @@trancount > 0 rollback transaction;
        throw;
    end catch;
end
