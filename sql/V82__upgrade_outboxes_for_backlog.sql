-- Generates the backlog procedure (V79) of every registered claim outbox, and records
-- generator version 3 (V81) on every feed and outbox, by regenerating their code from the
-- current templates in one transaction. An outbox skipped as broken gets its backlog
-- procedure when it is repaired and upgraded (exec changefeed.upgrade_outbox).
exec changefeed.upgrade_all_feeds;
