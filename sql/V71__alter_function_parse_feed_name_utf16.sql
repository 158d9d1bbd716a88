-- Splits and checks a caller's event-table name ('schema.table' or '[schema].[table]').
-- Replaces the first version: lengths are counted in UTF-16 code units (datalength / 2), the
-- unit identifiers (sysname, nvarchar(128)) count. len() counts a surrogate pair once under
-- a supplementary-character (_SC) collation, so a name of 100 emoji passed the 128 and 108
-- limits and its generated object names (over 128 units) then failed to be created, or
-- quotename returned NULL for them.
-- Returns one row: the two parts and, when the name cannot be a feed, a message that says
-- what is wrong and what to do (problem is null when the name is fine). A function cannot
-- THROW, so the calling procedure throws 51000 with that message.
--
-- The rule (the Rust Feed type applies the same one): each part is 1..128 UTF-16 code units with
-- no control character and none of [ ] ' " . \ and no leading or trailing space. Such a part
-- can go inside brackets and inside N'...' literals of generated code unescaped, and into
-- the feed's database role names (a role name may not contain a backslash). The per-feed
-- object names '<kind>:<schema>.<table>' must fit SQL Server's 128-character limit; the
-- longest kind is the role prefix 'changefeed.readers:' (19 characters), so schema and table
-- together may have at most 128 - 19 - 1 = 108 code units. '__template' is reserved for the
-- template feed whose code is copied for every feed, and the changefeed schema is ours.
create or alter function [changefeed].[parse_feed_name] (@table_name nvarchar(4000))
returns table
as
return
with parts as (
    select
        parsename(@table_name, 2) as schema_name,
        parsename(@table_name, 1) as table_name,
        parsename(@table_name, 3) as database_name
    -- parsename takes a sysname: a longer argument would be cut, not refused.
    where datalength(@table_name) / 2 <= 128
),

checked as (
    select
        p.schema_name,
        p.table_name,
        case
            when @table_name is null
                then N'The table name is null. Pass the event table as N''schema.table''.'
            when p.table_name is null
                then
                    N'The table name ''' + left(@table_name, 200)
                    + N''' is not a valid two-part name. Pass it as N''schema.table'''
                    + N' (at most 108 characters, brackets optional).'
            when p.database_name is not null or p.schema_name is null
                then
                    N'The table name ''' + @table_name
                    + N''' must have exactly two parts, schema and table, as N''schema.table''.'
            when exists (
                select 1
                from (values (p.schema_name), (p.table_name)) as n (part)
                where
                    n.part like N'%[[''".]%'
                    or charindex(N']', n.part) > 0
                    or charindex(N'\', n.part) > 0
                    or patindex(
                        N'%[' + nchar(1) + N'-' + nchar(31) + nchar(127) + N']%',
                        n.part collate Latin1_General_100_BIN2
                    ) > 0
                    or datalength(n.part) <> datalength(ltrim(rtrim(n.part)))
                    or len(n.part) = 0
            )
                then
                    N'The table name ''' + @table_name
                    + N''' has a part changefeed cannot use: a part must not contain'
                    + N' [ ] '' " . \ or control characters, nor begin or end with a space.'
                    + N' Rename the table or create a synonym-free copy with a plain name.'
            when (datalength(p.schema_name) + datalength(p.table_name)) / 2 > 108
                then
                    N'The table name ''' + @table_name
                    + N''' is too long: schema and table together may have at most 108'
                    + N' UTF-16 code units (a character outside the Basic Multilingual Plane,'
                    + N' such as an emoji, takes two), so that every per-feed object name'
                    + N' fits in 128.'
            when
                charindex(N'__template', p.schema_name collate Latin1_General_100_BIN2) > 0
                or charindex(N'__template', p.table_name collate Latin1_General_100_BIN2) > 0
                then
                    N'The table name ''' + @table_name
                    + N''' contains ''__template'', which changefeed reserves for its template'
                    + N' feed. Use another name.'
            when p.schema_name = N'changefeed'
                then
                    N'The table ''' + @table_name
                    + N''' is in the changefeed schema, which belongs to changefeed.'
                    + N' Keep event tables in your own schemas.'
        end as problem
    from (values (1)) as one (n)
    left outer join parts as p on 1 = 1
)

select
    schema_name,
    table_name,
    problem
from checked;
