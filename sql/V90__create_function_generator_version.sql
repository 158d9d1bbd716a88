-- A fourth generation of the per-outbox code (V81 made it 3): the claim's update and the
-- acknowledgements are pinned to seeks of the clustered index (V83-V86), so none of them
-- can wait for an open transaction on a row it does not touch. The registry's
-- generator_version then tells which outboxes have that code: the next migration
-- regenerates every one it can, and one skipped as broken (its indexes among the causes now,
-- V87-V89) keeps 3 until it is repaired and upgraded.
create or alter function [changefeed].[generator_version] ()
returns int
with schemabinding
as
begin
    return 4;
end
