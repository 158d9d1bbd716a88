-- A third generation of the per-outbox code (V72 made this release's first one 2): every
-- outbox gains its backlog procedure (V79, listed by outbox_objects in V80). The registry's
-- generator_version then tells which outboxes have it: the next migration regenerates
-- every one it can, and one skipped as broken keeps 2 until it is repaired and upgraded.
create or alter function [changefeed].[generator_version] ()
returns int
with schemabinding
as
begin
    return 3;
end
