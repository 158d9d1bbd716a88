-- The second release of the per-feed code generators: the templates and generators changed
-- (V50-V71: the ordered feed insert, the #read check, the upgrade that skips broken feeds and
-- outboxes, enqueue's aggregate lock, the claim's own expiry). The registry's
-- generator_version then tells which feeds and outboxes run the new code: the next migration
-- regenerates every one it can, and one that was skipped as broken keeps 1 until it is
-- repaired and upgraded.
create or alter function [changefeed].[generator_version] ()
returns int
with schemabinding
as
begin
    return 2;
end
