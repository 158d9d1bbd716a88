-- What is wrong with a claim outbox, with the statement that fixes it, as upgrade_all_feeds
-- last found it (its table dropped, re-created or renamed, or a column its procedures use
-- renamed or dropped); NULL when it works. upgrade_all_feeds skips such an outbox instead
-- of letting its regeneration fail and roll back every other feed, outbox and the
-- migration that called it (see there).
alter table [changefeed].[outboxes] add problem nvarchar(1000) null;
