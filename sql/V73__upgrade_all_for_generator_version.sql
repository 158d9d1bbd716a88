-- Records generator version 2 on every feed and claim outbox by regenerating their code from
-- the current templates (the code itself is what V58 and V64 already generated). A feed or
-- outbox that is skipped as broken keeps its older version, which is how an operator finds
-- it: select schema_name, table_name, generator_version, problem from changefeed.feeds.
exec changefeed.upgrade_all_feeds;
