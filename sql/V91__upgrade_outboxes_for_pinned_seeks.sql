-- Regenerates every feed's and claim outbox's code from the current templates, so every
-- outbox's claim and acknowledgements seek only the rows they touch (V83-V86), and records
-- generator version 4 (V90). An outbox whose clustered index on (id) or head_of_aggregate
-- was dropped, renamed or re-created otherwise by hand is skipped, keeps its old code, and
-- is reported with the statement that fixes it (outboxes.problem, V87-V89), instead of
-- rolling this migration back.
exec changefeed.upgrade_all_feeds;
