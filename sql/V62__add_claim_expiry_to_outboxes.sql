-- Gives the template outbox and every registered claim outbox the claim_expires_at column
-- and the open_messages index that includes it, through create_outbox_storage (which adds
-- the column, metadata only, and re-creates open_messages; see it). The claim template that
-- reads the column comes next, then every outbox's code is regenerated. Nothing else of an
-- existing table changes: its other indexes, constraints and collations are repaired only
-- where missing, as setup_outbox would.
exec changefeed.create_outbox_storage
    @schema_name = N'changefeed',
    @table_name = N'__template_outbox__',
    @native_json = 0;

declare @schema_name sysname;
declare @table_name sysname;
declare @native_json bit;

declare outboxes_to_extend cursor local fast_forward for
select
    o.schema_name,
    o.table_name,
    o.native_json
from changefeed.outboxes as o
-- Only tables that are still the ones registered: create_outbox_storage would create a
-- dropped one anew, which is setup_outbox's decision, not an upgrade's.
where
    object_id(quotename(o.schema_name) + N'.' + quotename(o.table_name), N'U') = o.object_id
    -- And only tables that have every column of the template outbox (but the one added
    -- above): create_outbox_storage refuses a table that lost or renamed one (51306), and
    -- under xact_abort that would roll the whole migration back. Such an outbox is reported
    -- and skipped by the upgrade_all_feeds below, keeps its old code, and gets the column
    -- from setup_outbox once it is repaired. Both names come from one catalog (one
    -- collation).
    and not exists (
        select 1
        from sys.columns as t
        where
            t.object_id = object_id(N'[changefeed].[__template_outbox__]', N'U')
            and t.name <> N'claim_expires_at'
            and not exists (
                select 1
                from sys.columns as c
                where c.object_id = o.object_id and c.name = t.name
            )
    )
order by o.outbox_id;

open outboxes_to_extend;
fetch next from outboxes_to_extend into @schema_name, @table_name, @native_json;
while @@fetch_status = 0
begin
    exec changefeed.create_outbox_storage
        @schema_name = @schema_name,
        @table_name = @table_name,
        @native_json = @native_json;
    fetch next from outboxes_to_extend into @schema_name, @table_name, @native_json;
end;
close outboxes_to_extend;
deallocate outboxes_to_extend;
