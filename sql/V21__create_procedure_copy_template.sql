-- Creates (or alters) one object for a feed or an outbox by copying a template's definition
-- and replacing its marked names (the generator behind upgrade_feed and upgrade_outbox).
--
-- @template          the quoted name of the template object, e.g.
--                    [changefeed].[read_feed:changefeed.__template__]
-- @template_table    the template's table within the changefeed schema, e.g. __template__
-- @schema_name, @table_name   the real table (checked by parse_feed_name)
-- @key_list, @key_join        the key column list '[a], [b]' and the join
--                    'e.[a] = r.[a] and e.[b] = r.[b]' (null for templates without keys)
-- @shard_column, @ulid_column the event table's shard and ULID columns of a
--                    serialized-writer feed (null otherwise)
--
-- The replacements, in this order, under a binary collation so they are exact whatever the
-- database's collation:
--   e.__template_key__ = r.__template_key__   -> @key_join
--   __template_key__                          -> @key_list
--   __template_shard__, __template_ulid__     -> [shard column], [ulid column]
--   [changefeed].[<template_table>]           -> [schema].[table]
--   changefeed.<template_table>               -> schema.table (inside per-object names and
--                                                the status view's literal)
-- Names and key columns containing '__template' are refused upstream, so no replacement
-- can touch text an earlier one inserted.
create or alter procedure [changefeed].[copy_template]
    @template nvarchar(300),
    @template_table sysname,
    @schema_name sysname,
    @table_name sysname,
    @key_list nvarchar(max) = null,
    @key_join nvarchar(max) = null,
    @shard_column sysname = null,
    @ulid_column sysname = null
as
begin
    set nocount, xact_abort on;
    -- With IMPLICIT_TRANSACTIONS ON (JDBC with autocommit off, pyodbc's default) the DDL below
    -- would open a transaction that nobody commits, with its schema locks held, when this
    -- runs on its own. Inside a caller's transaction it changes nothing. It reverts on return.
    set implicit_transactions off;

    declare @definition nvarchar(max) = object_definition(object_id(@template));
    declare @message nvarchar(2048);

    if @definition is null or charindex(N'create or alter', @definition) = 0
    begin
        set @message = N'The template ' + isnull(@template, N'(null)')
            + N' is missing or does not begin with create or alter. Re-apply the'
            + N' changefeed migrations.';
        throw 51009, @message, 1;
    end;
    if (@key_list is null or @key_join is null)
        and charindex(N'__template_key__', @definition collate Latin1_General_100_BIN2) > 0
    begin
        set @message = N'The template ' + @template
            + N' uses key columns, but no key was given to copy_template.';
        throw 51009, @message, 1;
    end;

    if (@shard_column is null or @ulid_column is null)
        and (
            charindex(N'__template_shard__', @definition collate Latin1_General_100_BIN2) > 0
            or charindex(N'__template_ulid__', @definition collate Latin1_General_100_BIN2) > 0
        )
    begin
        set @message = N'The template ' + @template
            + N' uses the shard and ulid columns, but none were given to copy_template.';
        throw 51009, @message, 1;
    end;

    if @key_join is not null
        set @definition = replace(
            @definition collate Latin1_General_100_BIN2,
            N'e.__template_key__ = r.__template_key__',
            @key_join
        );
    if @key_list is not null
        set @definition = replace(
            @definition collate Latin1_General_100_BIN2, N'__template_key__', @key_list
        );
    if @shard_column is not null
        set @definition = replace(
            @definition collate Latin1_General_100_BIN2,
            N'__template_shard__',
            quotename(@shard_column)
        );
    if @ulid_column is not null
        set @definition = replace(
            @definition collate Latin1_General_100_BIN2,
            N'__template_ulid__',
            quotename(@ulid_column)
        );
    set @definition = replace(
        @definition collate Latin1_General_100_BIN2,
        N'[changefeed].[' + @template_table + N']',
        quotename(@schema_name) + N'.' + quotename(@table_name)
    );
    set @definition = replace(
        @definition collate Latin1_General_100_BIN2,
        N'changefeed.' + @template_table,
        @schema_name + N'.' + @table_name
    );

    -- A NULL replacement would make the whole text NULL, which sp_executesql runs as nothing.
    if @definition is null
    begin
        set @message = N'copy_template: the text generated from ' + @template
            + N' is empty (a name or key list was NULL).';
        throw 51009, @message, 1;
    end;

    exec sys.sp_executesql @definition;
end
