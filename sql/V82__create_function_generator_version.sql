-- The third release of the per-outbox code: every outbox gains its backlog procedure (V80,
-- listed by outbox_objects in V81). The registry's generator_version then tells which
-- outboxes have it: the next migration regenerates every one it can, and one skipped as
-- broken keeps 2 until it is repaired and upgraded.
create or alter function [changefeed].[generator_version] ()
returns int
with schemabinding
as
begin
    return 3;
end
