-- Gives the template outbox the claim_expires_at column and the open_messages index that
-- includes it, through create_outbox_storage (which adds the column, metadata only, and
-- re-creates open_messages; see it). The claim template that reads the column comes next.
--
-- Only the template outbox: a registered outbox gets the column from its own upgrade
-- (upgrade_outbox, V88, calls create_outbox_storage when the table lacks a column of the
-- template), object by object after the migrations, in the short transaction that also
-- regenerates its code. Done here for every outbox, the migration would take a schema lock
-- on each outbox table in one transaction: each waits behind every open enqueue of that
-- table, every enqueue, claim and acknowledgement queues behind it, and all of them stay
-- locked until the migration commits. Until its upgrade an outbox keeps its old code, which
-- does not name the column (the compatibility argument is in ARCHITECTURE.md).
exec changefeed.create_outbox_storage
    @schema_name = N'changefeed',
    @table_name = N'__template_outbox__',
    @native_json = 0;
