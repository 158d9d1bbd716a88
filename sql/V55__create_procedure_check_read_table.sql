-- Checks a caller's #read before read_feed fills it: every column read_feed writes (ulid and
-- the key columns) must be there and hold every value exactly. Refuses with 51105 naming the
-- column, its type, and a declaration of the whole #read that this check accepts.
--
-- Why: #read is the caller's temp table, and inserting into it converts silently where a
-- conversion loses: a datetime column rounds a datetime2(7) key to 1/300 s, a decimal(18, 2)
-- column rounds a decimal(18, 4) key, a varchar column of another code page stores as '?'
-- what it cannot represent (a UTF-8 key in a Latin1 tempdb, say). The caller then joins
-- #read to the event table and misses rows, or finds the wrong ones, with no error.
--
-- Internal to read_feed, which creates #changefeed_read_check (ulid and the key columns, as
-- select top (0) ... into from its read type, so with the key's exact types and collations)
-- and then calls this. Both temp tables are the session's own, so their catalog rows are
-- visible to any caller (tempdb.sys.columns), unlike the read type's.
-- Exact, for a column k that read_feed writes into #read column r:
--   k a character type (it has a collation):
--     r nchar/nvarchar: at least as many UTF-16 units as k can hold (k varchar(n): n bytes
--       are at most n units in any code page, UTF-8 included);
--     r char/varchar of k's code page (both non-Unicode): at least k's bytes;
--     r char/varchar with a UTF-8 collation: at least 3 bytes per unit or byte of k (a UTF-16
--       unit needs at most 3 UTF-8 bytes; a surrogate pair, two units, needs 4);
--     max holds anything; a max key needs a max column. Another collation of the same code
--     page stores the keys exactly; the join then names the collation (README).
--   k any other type: r of the same type, length, precision and scale (a CLR type: the same
--     type), except two widenings that convert every value exactly: a wider integer type
--     (tinyint, smallint, int, bigint) and varbinary of at least k's bytes for binary or
--     varbinary. Everything else is refused, datetime for datetime2, datetime2(3) for
--     datetime2(7), float(24) for float(53), decimal(18, 2) for decimal(18, 4) included.
-- The declaration in the message is built from the catalog: type names from type_name(), a
-- length, precision or scale only where the type takes one, and a collate clause with the
-- key's own collation only on character columns, so executed as it is it creates a #read
-- this check accepts. Past 2048 characters (a long composite key) the message is cut.
create or alter procedure [changefeed].[check_read_table]
as
begin
    set nocount, xact_abort on;

    declare @message nvarchar(2048);

    -- Both tables' columns, each with its type written as a declaration writes it.
    -- system_type_id: 41 time, 42 datetime2, 43 datetimeoffset, 48 tinyint, 52 smallint,
    -- 56 int, 62 float, 106 decimal, 108 numeric, 127 bigint, 165 varbinary, 167 varchar,
    -- 173 binary, 175 char, 231 nvarchar (and sysname), 239 nchar, 240 CLR types.
    with read_columns as (
        select
            convert(bit, 1) as is_expected,
            c.column_id,
            c.name,
            c.system_type_id,
            c.user_type_id,
            c.max_length,
            c.[precision],
            c.scale,
            c.collation_name
        from tempdb.sys.columns as c
        where c.object_id = object_id(N'tempdb..#changefeed_read_check')
        union all
        select
            convert(bit, 0) as is_expected,
            c.column_id,
            c.name,
            c.system_type_id,
            c.user_type_id,
            c.max_length,
            c.[precision],
            c.scale,
            c.collation_name
        from tempdb.sys.columns as c
        where c.object_id = object_id(N'tempdb..#read')
    ),

    described as (
        select
            is_expected,
            column_id,
            name,
            system_type_id,
            user_type_id,
            max_length,
            [precision],
            scale,
            collation_name,
            convert(int, collationproperty(collation_name, 'CodePage')) as code_page,
            convert(bit, case when system_type_id in (231, 239) then 1 else 0 end)
                as is_unicode,
            case system_type_id
                when 48 then 1
                when 52 then 2
                when 56 then 3
                when 127 then 4
            end as integer_rank,
            concat(
                case
                    -- type_name(231) is nvarchar: a sysname column is written nvarchar(128).
                    when system_type_id = 240 then type_name(user_type_id)
                    when system_type_id in (165, 167, 173, 175) then concat(
                        type_name(system_type_id), N'(',
                        case
                            when max_length = -1 then N'max'
                            else convert(nvarchar(6), max_length)
                        end,
                        N')'
                    )
                    when system_type_id in (231, 239) then concat(
                        type_name(system_type_id), N'(',
                        case
                            when max_length = -1 then N'max'
                            else convert(nvarchar(6), max_length / 2)
                        end,
                        N')'
                    )
                    when system_type_id in (106, 108) then concat(
                        type_name(system_type_id), N'(', [precision], N', ', scale, N')'
                    )
                    when system_type_id in (41, 42, 43)
                        then concat(type_name(system_type_id), N'(', scale, N')')
                    when system_type_id = 62 then concat(N'float(', [precision], N')')
                    else type_name(system_type_id)
                end,
                case
                    when collation_name is null then N''
                    else concat(N' collate ', collation_name)
                end
            ) as declared_type
        from read_columns
    ),

    judged as (
        select
            e.column_id,
            e.name,
            e.declared_type,
            e.collation_name,
            e.code_page,
            g.name as given_name,
            g.declared_type as given_type,
            g.collation_name as given_collation,
            g.code_page as given_code_page,
            -- A CASE, not a bare predicate: a comparison with a NULL (a column's integer rank,
            -- code page) must count as "not exact", never as "not refused".
            case
                when g.name is null then 0
                when
                    e.collation_name is not null
                    and g.is_unicode = 1
                    and (
                        g.max_length = -1
                        or (
                            e.max_length <> -1
                            and g.max_length >= case
                                when e.is_unicode = 1 then e.max_length
                                else 2 * e.max_length
                            end
                        )
                    )
                    then 1
                when
                    e.collation_name is not null
                    and g.system_type_id in (167, 175)
                    and e.is_unicode = 0
                    and g.code_page = e.code_page
                    and (
                        g.max_length = -1
                        or (e.max_length <> -1 and g.max_length >= e.max_length)
                    )
                    then 1
                when
                    e.collation_name is not null
                    and g.system_type_id in (167, 175)
                    and g.code_page = 65001
                    and (
                        g.max_length = -1
                        or (
                            e.max_length <> -1
                            and g.max_length >= 3 * case
                                when e.is_unicode = 1 then e.max_length / 2
                                else e.max_length
                            end
                        )
                    )
                    then 1
                when
                    e.collation_name is null
                    and g.system_type_id = e.system_type_id
                    and g.max_length = e.max_length
                    and g.[precision] = e.[precision]
                    and g.scale = e.scale
                    and (e.system_type_id <> 240 or g.user_type_id = e.user_type_id)
                    then 1
                when e.collation_name is null and g.integer_rank >= e.integer_rank then 1
                when
                    e.collation_name is null
                    and e.system_type_id in (165, 173)
                    and g.system_type_id = 165
                    and (
                        g.max_length = -1
                        or (e.max_length <> -1 and g.max_length >= e.max_length)
                    )
                    then 1
                else 0
            end as holds_exactly
        from described as e
        left outer join described as g
            on g.is_expected = 0 and g.name = e.name
        where e.is_expected = 1
    )

    select top (1)
        @message = concat(
            N'read_feed: #read column ', quotename(j.name),
            case
                when j.given_name is null then N' is missing'
                else concat(
                    N' is ', j.given_type,
                    case
                        when j.given_collation is null then N''
                        else concat(N' (code page ', j.given_code_page, N')')
                    end
                )
            end,
            N', and read_feed writes it as ', j.declared_type,
            case
                when j.collation_name is null then N''
                else concat(N' (code page ', j.code_page, N')')
            end,
            N', which #read must hold exactly. Declare #read as read_feed writes it:',
            N' create table #read (',
            (
                select
                    string_agg(
                        convert(
                            nvarchar(max),
                            concat(quotename(d.name), N' ', d.declared_type, N' not null')
                        ),
                        N', '
                    ) within group (order by d.column_id)
                from described as d
                where d.is_expected = 1
            ),
            N'); a character key column may also be nvarchar of the key''s length.'
        )
    from judged as j
    where j.holds_exactly = 0
    order by j.column_id;

    if @message is not null
        throw 51105, @message, 1;
end
