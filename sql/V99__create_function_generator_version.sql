-- A fifth generation of the per-feed code (V90 made it 4): purge_feed holds back only for
-- registered consumers and names the consumers it passed (V98). The registry's
-- generator_version then tells which feeds have that code: the regeneration after the
-- migrations (upgrade_all_feeds @only_outdated = 1) reaches every one it can, and one skipped
-- as broken or busy keeps its older version (and its old purge_feed, which every saved
-- cursor holds back: it never deletes more than the new one) until it is upgraded.
create or alter function [changefeed].[generator_version] ()
returns int
with schemabinding
as
begin
    return 5;
end
