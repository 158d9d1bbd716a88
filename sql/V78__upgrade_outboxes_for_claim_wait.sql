-- Regenerates every feed's and claim outbox's code from the current templates, so every
-- outbox's claim takes @wait_ms (V77). generator_version stays 2 (V72) here: V72 to this
-- file are one step of this release (V81 makes a later one 3). Every upgrade from a
-- released bundle runs V73 and this file in one migration run, so an outbox that V73
-- regenerated is regenerated here too, and one skipped as broken is skipped by both and
-- keeps 1. A repaired outbox that its owner regenerates with upgrade_outbox gets the
-- current code, @wait_ms included, and records 2.
exec changefeed.upgrade_all_feeds;
