-- Regenerates every feed's and claim outbox's code from the templates changed by the migrations
-- before this one (enqueue and claim of the claim outbox), in one transaction.
exec changefeed.upgrade_all_feeds;
