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
    schema_name,
    table_name,
    native_json
from changefeed.outboxes
-- Only tables that are still the ones registered: create_outbox_storage would create a
-- dropped one anew, which is setup_outbox's decision, not an upgrade's.
where object_id(quotename(schema_name) + N'.' + quotename(table_name), N'U') = object_id
order by outbox_id;

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
