-- Regenerates every feed's read_feed from the templates just changed (the serial,
-- ULID-ordered feed insert of outbox mode; the #read check of both modes), and every claim
-- outbox's procedures. A feed or outbox that cannot be regenerated is skipped and reported
-- (upgrade_all_feeds), so this migration commits all the same.
exec changefeed.upgrade_all_feeds;
