-- The version of the per-feed code generators in this bundle. A migration that changes a
-- generator or a template raises it and ends with exec changefeed.upgrade_all_feeds; the
-- registry records which version generated each feed's code.
create or alter function [changefeed].[generator_version] ()
returns int
with schemabinding
as
begin
    return 1;
end
