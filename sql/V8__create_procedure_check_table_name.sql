-- Splits and checks a caller's table name with changefeed.parse_feed_name and raises 51000
-- with its message when the name cannot be used: the first step of every procedure that
-- takes a table name from a caller.
create or alter procedure [changefeed].[check_table_name]
    @table_name nvarchar(4000),
    @schema_name sysname output,
    @object_name sysname output
as
begin
    set nocount, xact_abort on;

    declare @problem nvarchar(2048);

    select
        @schema_name = schema_name,
        @object_name = table_name,
        @problem = problem
    from changefeed.parse_feed_name(@table_name);

    if @problem is not null throw 51000, @problem, 1;
end
