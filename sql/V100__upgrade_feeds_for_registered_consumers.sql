-- Regenerates every feed's and claim outbox's code from the current templates, so every
-- outbox-mode feed's purge_feed holds back only for registered consumers (V98; the consumers
-- that had saved cursors before the upgrade were registered by V93), and records generator
-- version 5 (V99). A broken feed or outbox is skipped and reported, as before (V89).
exec changefeed.upgrade_all_feeds;
