-- Refuses a table that changefeed's procedures would reach outside their ownership chain
-- (51013, with changefeed.owner_chain_problem's text: who owns what, the statement that
-- fixes it and what that statement removes), @caller's name in front. setup_feed and
-- setup_outbox call it before they create or register anything.
create or alter procedure [changefeed].[check_owner_chain]
    @schema_name sysname,
    @table_name sysname,
    @caller sysname
as
begin
    set nocount, xact_abort on;

    declare @problem nvarchar(1000);
    declare @message nvarchar(2048);

    select @problem = problem
    from changefeed.owner_chain_problem(@schema_name, @table_name);
    if @problem is not null
    begin
        set @message = @caller + N': ' + @problem + N' Then run ' + @caller + N' again.';
        throw 51013, @message, 1;
    end;
end
