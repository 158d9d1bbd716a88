-- The template claim outbox. Its procedures (the next files) are written once, as real
-- objects of this table, so that every static gate parses them and SQL Server compiles them
-- at migration time; changefeed.upgrade_outbox copies them for each real outbox, replacing
--   [changefeed].[__template_outbox__]   the outbox table
--   changefeed.__template_outbox__       the 'schema.table' inside per-outbox names
-- It is not registered in changefeed.outboxes.
exec changefeed.create_outbox_storage
    @schema_name = N'changefeed',
    @table_name = N'__template_outbox__',
    @native_json = 0;
