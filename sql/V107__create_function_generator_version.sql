-- A sixth generation (V99 made it 5): an outbox's upgrade creates its roles,
-- [changefeed.relay:S.T] and [changefeed.enqueue:S.T] (grant_outbox_roles, V105), and a
-- feed or outbox whose table is outside the ownership chain of changefeed's procedures is
-- reported as its problem (V103, V104) instead of being regenerated. The per-object code
-- itself is unchanged; the version tells the upgrade that runs after the migrations
-- (upgrade_all_feeds for every object below this version) to reach every feed and outbox
-- once more: outboxes get their roles, and feeds and outboxes set up on such tables before
-- the check existed get their problem recorded and reported.
create or alter function [changefeed].[generator_version] ()
returns int
with schemabinding
as
begin
    return 6;
end
